"""Shapes, provisional peaks, transfer between levels and tasks, throughput: the pure parts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rows_helpers import attempt_of, job_of
from store_helpers import declared_plan

from orchestrator.prediction.learned import (
    Knowledge,
    attempt_peak_so_far,
    held_peaks,
    running_peaks,
)
from orchestrator.prediction.memory import predict_peak_mib, shape_key
from orchestrator.prediction.shapes import (
    RunningPeak,
    Transfer,
    fold_running,
    level_transfer,
    measured_margin,
    memory_hash,
    parse_shape_key,
    provisional_step_reached,
    running_margin,
    task_transfer,
)
from orchestrator.prediction.throughput import (
    curves_by_gpu,
    interval_rate,
    marginal_gain,
    relative_curve,
)
from orchestrator.scheduling.packing.pack import pack
from orchestrator.scheduling.packing.types import GpuState, PackingPolicy, QueuedJob, RunningAttempt
from orchestrator.store.peak_source import PredictionSource, SourceKind
from orchestrator.store.rows import Attempt, ShapeMemory
from tests.store_reads import job_ids

BASE = {"model": "m", "batch_size": 8, "max_seq_len": 256, "prec": "bf16", "learning_rate": 1e-4,
        "num_epochs": 3, "seed": 1, "data": "glue_rte", "eval_every_steps": 50, "sim_seconds": 20}


@pytest.mark.parametrize("key, value", [("learning_rate", 3e-4), ("num_epochs", 9), ("seed", 7),
                                        ("eval_every_steps", 10), ("sim_seconds", 5), ("warmup_steps", 3)])
def test_keys_that_do_not_decide_memory_keep_the_shape(key: str, value: object) -> None:
    assert memory_hash({**BASE, key: value}) == memory_hash(BASE)


@pytest.mark.parametrize("key, value", [("batch_size", 4), ("max_seq_len", 128), ("prec", "fp32"),
                                        ("gradient_checkpointing", True), ("logits_to_keep", 1),
                                        ("model", "other"), ("peft", "r16.json"), ("sim_mem_gib", 9)])
def test_keys_that_decide_memory_change_the_shape(key: str, value: object) -> None:
    assert memory_hash({**BASE, key: value}) != memory_hash(BASE)


def test_suite_memory_keys_join_the_shape() -> None:
    assert memory_hash({**BASE, "chunk": 64}) == memory_hash({**BASE, "chunk": 128})
    assert memory_hash({**BASE, "chunk": 64}, ["chunk"]) != memory_hash({**BASE, "chunk": 128}, ["chunk"])


def test_a_foreign_scripts_shape_is_every_key_but_the_harmless() -> None:
    # its memory keys are unknown: a 7B and a 1B model under `model_name_or_path`, or a batch
    # under its own name `bs`, must not share one learned peak
    hf = {"model_name_or_path": "llama-1b", "bs": 4, "learning_rate": 1e-4, "seed": 1, "num_train_epochs": 3}
    assert memory_hash(hf) == memory_hash({**hf, "model_name_or_path": "llama-7b"})  # known keys only
    assert memory_hash(hf, foreign=True) != memory_hash({**hf, "model_name_or_path": "llama-7b"}, foreign=True)
    assert memory_hash(hf, foreign=True) != memory_hash({**hf, "bs": 32}, foreign=True)
    same = {**hf, "learning_rate": 3e-4, "seed": 2, "num_train_epochs": 5, "output_dir": "/x"}
    assert memory_hash(hf, foreign=True) == memory_hash(same, foreign=True)


def test_sim_accumulation_counts_only_without_a_reference_batch() -> None:
    sim = {**BASE, "sim_mem_gib": 5, "gradient_accumulation_steps": 1}
    assert memory_hash(sim) != memory_hash({**sim, "gradient_accumulation_steps": 2})
    fixed = {**sim, "sim_reference_batch": 8}
    assert memory_hash(fixed) == memory_hash({**fixed, "gradient_accumulation_steps": 2})
    assert memory_hash(BASE) == memory_hash({**BASE, "gradient_accumulation_steps": 4})


def test_shape_key_parts_round_trip() -> None:
    parts = parse_shape_key(shape_key("abc", "org/model|x", "glue_rte"))
    assert parts is not None and (parts.base, parts.task) == ("abc|org/model|x", "glue_rte")
    assert parse_shape_key("no-separators") is None


def test_provisional_point_waits_for_k_steps_and_the_first_evaluation() -> None:
    assert not provisional_step_reached(None, None)
    assert not provisional_step_reached(9, None)
    assert provisional_step_reached(10, None)
    assert not provisional_step_reached(40, 50)  # the worker evaluates at step 50: not yet
    assert not provisional_step_reached(50, 50)  # the evaluation may still be running
    assert provisional_step_reached(51, 50)


def test_margins_shrink_with_evidence() -> None:
    assert running_margin(10) == pytest.approx(0.15)
    assert running_margin(100) == pytest.approx(0.06)
    assert measured_margin(1) == pytest.approx(0.05)
    assert measured_margin(4) == pytest.approx(0.025)
    assert measured_margin(100) == pytest.approx(0.02)


def test_running_peak_is_used_until_completion_replaces_it() -> None:
    running = RunningPeak(peak_mib=10_000, step=10)
    p = predict_peak_mib(None, 30_000, 20_000, running=running)
    assert (p.mib, p.source) == (11_500, PredictionSource(SourceKind.RUNNING, step=10))
    assert p.source.render() == "measured: running, step 10"
    done = predict_peak_mib(ShapeMemory(10_400, None, 1), 30_000, 20_000, running=running)
    assert (done.mib, done.source.kind) == (10_920, SourceKind.MEASURED)
    # a running attempt that has already gone above the completed peak raises it
    higher = predict_peak_mib(ShapeMemory(9_000, None, 1), None, None, running=running)
    assert higher.mib == 10_500
    # an OOM floor above everything still wins
    floor = predict_peak_mib(ShapeMemory(None, 15_000, 0), None, None, running=running)
    assert floor.source.kind is SourceKind.OOM_FLOOR and floor.mib == 15_750


def test_transfer_comes_before_estimate_and_declared() -> None:
    p = predict_peak_mib(None, 30_000, 20_000, transfer=Transfer(8_000, PredictionSource(SourceKind.LEVEL, level=0)))
    assert (p.mib, p.source.render()) == (8_400, "measured: level 0 peak")


def test_fold_running_keeps_the_largest_peak_and_furthest_step() -> None:
    folded = fold_running([("a", 5_000, 12), ("a", 5_500, 10), ("b", 1_000, 30)])
    assert folded == {"a": RunningPeak(5_500, 12, 2), "b": RunningPeak(1_000, 30, 1)}


LEVEL_1 = PredictionSource(SourceKind.LEVEL, level=1)


def test_level_transfer_takes_the_nearest_lower_level_scaled_down() -> None:
    assert level_transfer(0, {1: 9_000}) is None  # a higher level says nothing about a lower one
    assert level_transfer(2, {0: 14_000, 1: 9_000}) == Transfer(9_000, LEVEL_1)
    assert level_transfer(2, {1: 9_000}, {1: 0.7}) == Transfer(6_300, LEVEL_1)
    assert level_transfer(2, {1: 9_000}, {1: 1.4}) == Transfer(9_000, LEVEL_1)  # a bound


def test_task_transfer_scales_by_prompt_length_and_keeps_the_tightest_bound() -> None:
    assert task_transfer(None, {"a": (8_000, 100)}) is None
    assert task_transfer(100, {"a": (8_000, None)}) is None
    longer = task_transfer(100, {"qnli": (8_000, 200)})  # longer prompts there: their peak bounds ours
    assert longer is not None and longer.mib == 8_000
    shorter = task_transfer(200, {"rte": (4_000, 100)})  # shorter there: scale the whole peak up
    assert shorter is not None and shorter.mib == 8_000
    both = task_transfer(150, {"qnli": (9_000, 300), "rte": (4_000, 100)})
    assert both is not None and both.mib == 6_000 and both.source.task == "rte"
    assert both.source.render() == "measured: rte peak at 100 tokens, scaled to 150"


def _attempt(job_id: int, level: int, step: int | None, peak: int, reported: int | None = None) -> Attempt:
    progress = None if step is None else json.dumps({"step": step, "peak_mem_mib": reported})
    return attempt_of(job_id=job_id, level=level, progress_json=progress, peak_mib=peak)


def test_running_peaks_from_live_attempts() -> None:
    jobs = {1: job_of(id=1, config_json=json.dumps({"eval_every_steps": 20})), 2: job_of(id=2), 3: job_of(id=3)}
    live = [_attempt(1, 0, 15, 9_000), _attempt(2, 0, 12, 5_000, reported=5_200), _attempt(3, 0, 3, 7_000)]
    peaks = running_peaks(live, jobs, lambda job, attempt: "k")
    assert peaks == {"k": RunningPeak(5_200, 12, 1)}  # job 1 awaits its evaluation, job 3 step K
    assert attempt_peak_so_far(_attempt(1, 0, 1, 100, reported=10**9)) == 100  # absurd report ignored


def test_memory_held_before_step_k_is_a_floor_not_a_measurement() -> None:
    jobs = {1: job_of(id=1), 2: job_of(id=2), 3: job_of(id=3)}
    live = [_attempt(1, 0, 3, 10_000), _attempt(2, 0, None, 800), _attempt(3, 0, 12, 5_000)]
    held = held_peaks(live, jobs, lambda job, attempt: "k")
    assert held == {"k": RunningPeak(10_000, 3, 2)}  # job 3 passed step K: it is `running`, not held
    # an under-declared shape: 8 GiB declared, its first attempt already holds 10,000 MiB at step 3
    p = predict_peak_mib(None, None, 8_192, held=held["k"])
    assert (p.mib, p.source.render()) == (11_500, "measured: running, step 3")
    # it only ever raises a prediction: a loading attempt's 800 MiB leaves the declared figure
    low = predict_peak_mib(None, None, 8_192, held=RunningPeak(800, 0, 1))
    assert (low.mib, low.source.kind) == (8_192, SourceKind.DECLARED)
    # a shape measured to completion keeps its own margin: held memory below its peak adds nothing
    measured = predict_peak_mib(ShapeMemory(4_598, None, 1), None, 20_480, held=RunningPeak(4_580, 1, 1))
    assert (measured.mib, measured.source.kind) == (4_828, SourceKind.MEASURED)
    above = predict_peak_mib(ShapeMemory(4_598, None, 1), None, 20_480, held=RunningPeak(5_000, 1, 1))
    assert (above.mib, above.source.kind) == (5_250, SourceKind.MEASURED)


def test_knowledge_transfers_between_levels_then_tasks() -> None:
    # the job's level-0 shape ("h0") and its level-1 shape ("h1", e.g. checkpointing on)
    shapes = {shape_key("h0", "m", "rte"): ShapeMemory(12_000, None, 1)}
    running = {shape_key("h1", "m", "qnli"): RunningPeak(7_000, 15)}
    k = Knowledge(shapes, running)
    lengths = {"rte": 100, "qnli": 250, "sst2": 50}.get
    lower = {0: shape_key("h0", "m", "rte"), 1: shape_key("h1", "m", "rte")}
    assert k.transfer(shape_key("h2", "m", "rte"), None, lengths, lower) == Transfer(
        12_000, PredictionSource(SourceKind.LEVEL, level=0)
    )
    via_task = k.transfer(shape_key("h1", "m", "sst2"), None, lengths)
    assert via_task is not None and via_task.mib == 7_000 and via_task.source.task == "qnli"
    assert k.transfer(shape_key("other", "m", "rte"), None, lengths) is None


def test_throughput_curve_and_marginal_gain() -> None:
    # the H100 figures: aggregate 1, 2.14, 2.37, 2.36 × one job alone; 2 jobs never do more than
    # 2 jobs' work, so the 2.14 (noise) reads 2
    rates = {1: 101.0, 2: 101.0 * 2.14 / 2, 3: 101.0 * 2.37 / 3, 4: 101.0 * 2.36 / 4}
    curve = relative_curve(rates)
    assert curve[2] == 2.0 and curve[3] == pytest.approx(2.37) and curve[4] == pytest.approx(2.36)
    assert relative_curve({1: 10.0, 3: 10.6})[3] == 3.0  # "3 jobs: 3.16x" is capped at 3x
    assert marginal_gain(curve, 0) == 1.0
    assert marginal_gain(curve, 1) == pytest.approx(1.0)
    assert marginal_gain(curve, 2) == pytest.approx(0.37)
    assert marginal_gain(curve, 4) is None  # 5 jobs never measured
    assert relative_curve({2: 50.0}) == {}  # no solo reading: nothing to compare with
    assert interval_rate(10, 100.0, 20, 105.0, 16) == pytest.approx(32.0)
    assert interval_rate(10, 100.0, 10, 105.0, 16) is None
    assert interval_rate(0, 100.0, 1, 140.0, 16) is None  # from before the first step: start-up, not training


def test_curves_pool_over_gpus_without_their_own_solo_reading() -> None:
    curves = curves_by_gpu([("s", "g0", 1, 100.0), ("s", "g0", 2, 60.0), ("s", "g1", 2, 70.0)])
    assert curves["s"]["g0"] == {1: 1.0, 2: 1.2}
    assert curves["s"]["g1"] == {1: 1.0, 2: pytest.approx(1.3)}  # pooled: mean of 60 and 70


def _gpu(index: int) -> GpuState:
    return GpuState(index=index, uuid=f"g{index}", total_mib=80_000, free_mib=80_000, slots=4)


def test_placement_spreads_over_idle_cards_then_stacks_by_gain_and_stops_below_min_gain() -> None:
    curve = {1: 1.0, 2: 2.14, 3: 2.37, 4: 2.36}
    running = [RunningAttempt(10, 0, 5_000, 5_000, True), RunningAttempt(11, 1, 5_000, 5_000, True),
               RunningAttempt(12, 1, 5_000, 5_000, True)]
    gpus = [_gpu(0), _gpu(1), _gpu(2)]
    job = QueuedJob(1, 0, 1, 5_000, 0.0, throughput_by_gpu={0: curve, 1: curve, 2: curve}, min_stack_gain=0.10)
    assert pack([job], gpus, running, PackingPolicy(), 0.0).placements[0].gpu_index == 2  # idle first
    busy = [*running, RunningAttempt(13, 2, 5_000, 5_000, True), RunningAttempt(14, 2, 5_000, 5_000, True),
            RunningAttempt(15, 2, 5_000, 5_000, True)]
    # card 0 holds 1 job (gain 1.14), card 1 holds 2 (gain 0.23), card 2 holds 3 (gain -0.01)
    assert pack([job], gpus, busy, PackingPolicy(), 0.0).placements[0].gpu_index == 0
    full = [*busy, RunningAttempt(16, 0, 5_000, 5_000, True), RunningAttempt(17, 0, 5_000, 5_000, True),
            RunningAttempt(18, 1, 5_000, 5_000, True)]  # 3 jobs on every card: gain -0.01
    decision = pack([job], gpus, full, PackingPolicy(), 0.0)
    assert decision.placements == () and "below min_stack_gain 10%" in decision.wait_reasons[1]
    unmeasured = QueuedJob(1, 0, 1, 5_000, 0.0, min_stack_gain=0.10)  # no curve: the plan decides
    assert pack([unmeasured], gpus, full, PackingPolicy(), 0.0).placements != ()


def _suite(tmp_path, **extra: object):  # type: ignore[no-untyped-def]
    import yaml

    from orchestrator.plans.suite import load_suite

    (tmp_path / "suites").mkdir(exist_ok=True)
    (tmp_path / "configs" / "s").mkdir(parents=True, exist_ok=True)
    (tmp_path / "configs" / "s" / "c.yaml").write_text("model: m\nbatch_size: 4\n")
    (tmp_path / "suites" / "s.yaml").write_text(
        yaml.safe_dump({"worker": "sim", "mem_gib": 4, "configs": ["c"], **extra})
    )
    return load_suite("s", tmp_path)


def test_suite_memory_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from orchestrator.errors import PlanError

    suite = _suite(tmp_path, memory_keys=["chunk_size"], min_stack_gain=0.1)
    assert suite.memory_keys == ("chunk_size",) and suite.min_stack_gain == 0.1
    assert _suite(tmp_path).min_stack_gain is None
    for bad in ({"memory_keys": "chunk"}, {"memory_keys": [3]}, {"min_stack_gain": 2}, {"min_stack_gain": "x"}):
        with pytest.raises(PlanError):
            _suite(tmp_path, **bad)
    from orchestrator.plans.suite import load_suite

    # written by hand as `min_stack_gain: 1e-3`, which YAML 1.1 reads as text
    (tmp_path / "suites" / "s.yaml").write_text("worker: sim\nmem_gib: 4\nconfigs: [c]\nmin_stack_gain: 1e-3\n")
    with pytest.raises(PlanError, match=r"YAML reads 1e-3 as text: write 0\.001"):
        load_suite("s", tmp_path)
    (tmp_path / "suites" / "s.yaml").write_text("worker: sim\nmem_gib: 4\nconfigs: [c]\nmin_stack_gain: 1e-5\n")
    with pytest.raises(PlanError, match=r"write 0\.00001\)"):  # not 1e-05, which YAML reads as text too
        load_suite("s", tmp_path)


def test_orch_memory_lists_and_forgets(orch_inproc, db_path) -> None:  # type: ignore[no-untyped-def]
    from orchestrator.store.attempts import write_shape
    from orchestrator.store.db import Store
    from orchestrator.store.learning import label_shape, record_throughput

    key = shape_key("h", "m", "glue_rte")
    with Store(db_path) as store:
        write_shape(store, key, ShapeMemory(10_240, None, 2))
        label_shape(store, key, "E1", "c L0 glue_rte")
        record_throughput(store, "GPU-1", key, 1, 100.0, "E1", steps=30)
        record_throughput(store, "GPU-1", key, 2, 55.0, "E1", steps=12)
        record_throughput(store, "GPU-1", key, 2, 65.0, "E1", steps=12)
        record_throughput(store, "GPU-1", key, 3, 40.0, "E1", steps=5)  # too few steps to count
        write_shape(store, "other|m|t", ShapeMemory(None, 4_000, 0))
    listed = json.loads(orch_inproc("memory", "--json").stdout)["shapes"]
    first = next(s for s in listed if s["shape"] == key)
    assert first["peak_mib"] == 10_240 and first["samples"] == 2 and first["source"] == "measured (2 attempts)"
    assert first["throughput"]["GPU-1"]["relative"] == {"1": 1.0, "2": 1.2}
    assert first["throughput"]["GPU-1"]["spread"] == {"1": 0.0, "2": 0.17}  # (65 - 55) / 60
    shown = orch_inproc("memory").stdout
    # configs of one name in two suites differ
    assert "1:1.0x (±0%), 2:1.2x (±8%)" in shown and "E1/c L0 glue_rte" in shown
    for bad in (("memory", "forget"), ("memory", "forget", key, "--suite", "E1"),
                ("memory", "forget", "nope"), ("memory", "forget", "a\x01b")):
        result = orch_inproc(*bad)
        assert result.rc == 2 and len(result.stderr.strip().splitlines()) == 1, bad
    assert len(json.loads(orch_inproc("memory", "--json").stdout)["shapes"]) == 2  # nothing went
    assert orch_inproc("memory", "forget", "--suite", "E1").rc == 0
    assert [s["shape"] for s in json.loads(orch_inproc("memory", "--json").stdout)["shapes"]] == ["other|m|t"]
    assert orch_inproc("memory", "forget", "other|m|t").rc == 0
    assert json.loads(orch_inproc("memory", "--json").stdout)["shapes"] == []


def test_forget_suite_finds_shapes_another_suite_taught_after_it(  # type: ignore[no-untyped-def]
    orch_inproc, db_path
) -> None:
    from orchestrator.store.attempts import write_shape
    from orchestrator.store.db import Store
    from orchestrator.store.learning import label_shape, record_throughput

    shared, own = shape_key("h", "m", "glue_rte"), shape_key("g", "m", "glue_rte")
    with Store(db_path) as store:
        write_shape(store, shared, ShapeMemory(10_240, None, 2))
        label_shape(store, shared, "low", "c L0 glue_rte")
        label_shape(store, shared, "low", "c L0 glue_rte")  # a suite is listed once
        label_shape(store, shared, "nomk", "c L0 glue_rte")  # the last teacher is another suite
        write_shape(store, own, ShapeMemory(4_096, None, 1))
        label_shape(store, own, "nomk", "d L0 glue_rte")
        record_throughput(store, "GPU-1", shape_key("t", "m", "glue_rte"), 1, 50.0, "low")  # throughput only
        assert store.query("SELECT suites_json FROM memory_shapes WHERE shape_key = ?", [shared])[0][
            "suites_json"] == '["low","nomk"]'  # fmt: skip
    for bad in (("--suite", "nosuite"), ("--suite", "")):
        result = orch_inproc("memory", "forget", *bad)
        assert result.rc == 2 and len(result.stderr.strip().splitlines()) == 1, bad
    assert "no suite 'nosuite'" in orch_inproc("memory", "forget", "--suite", "nosuite").stderr
    assert len(json.loads(orch_inproc("memory", "--json").stdout)["shapes"]) == 3  # nothing went
    # a shape two suites taught is named by both, not by the last one alone
    listed = {s["shape"]: s for s in json.loads(orch_inproc("memory", "--json").stdout)["shapes"]}
    assert (listed[shared]["suites"], listed[shared]["suite"]) == (["low", "nomk"], "nomk")
    assert listed[own]["suites"] == ["nomk"]
    assert "low,nomk/c L0 glue_rte" in orch_inproc("memory").stdout
    result = orch_inproc("memory", "forget", "--suite", "low", "--json")
    assert result.rc == 0
    assert sorted(json.loads(result.stdout)["shapes"]) == sorted([shared, shape_key("t", "m", "glue_rte")])
    assert [s["shape"] for s in json.loads(orch_inproc("memory", "--json").stdout)["shapes"]] == [own]
    # memory taught by another suite stays; only the readings `low` measured last go
    other = shape_key("u", "m", "glue_rte")
    with Store(db_path) as store:
        write_shape(store, other, ShapeMemory(6_000, None, 1))
        label_shape(store, other, "nomk", "e L0 glue_rte")
        record_throughput(store, "GPU-1", other, 1, 20.0, "low")
    assert json.loads(orch_inproc("memory", "forget", "--suite", "low", "--json").stdout)["shapes"] == [other]
    kept = {s["shape"]: s for s in json.loads(orch_inproc("memory", "--json").stdout)["shapes"]}
    assert kept[other]["peak_mib"] == 6_000 and kept[other]["throughput"] == {}


def test_old_shape_rows_keep_their_teacher_through_the_migration(tmp_path: Path) -> None:
    import sqlite3

    from orchestrator.store.db import Store
    from orchestrator.store.learning import forget_shapes
    from tests.store_helpers import old_database_with_one_job

    db = tmp_path / "state.db"
    old_database_with_one_job(db, stop_before="m015_shape_teachers")
    with sqlite3.connect(str(db)) as conn:
        conn.execute("INSERT INTO memory_shapes (shape_key, peak_mib, samples, updated_at, suite, label) "
                     "VALUES ('k', 1000, 1, 0, 'E1', 'c L0 t')")  # fmt: skip
    with Store(db) as store:
        assert forget_shapes(store, suite="E1") == ["k"]


def test_a_floor_equal_to_the_measured_peak_does_not_outbid_it() -> None:
    # a success after an OOM leaves floor == peak; with more samples the margin shrinks alike
    for samples in (1, 2, 5):
        p = predict_peak_mib(ShapeMemory(15_360, 15_360, samples), None, 8_192)
        assert p.source.kind is SourceKind.MEASURED, samples
    assert predict_peak_mib(ShapeMemory(15_360, 20_000, 3), None, 8_192).source.kind is SourceKind.OOM_FLOOR


def test_packing_benchmark_oracle_and_step_k_learning() -> None:
    from pathlib import Path

    from benchmarks.packing.daemon_policy import EstimatePolicy, OraclePolicy, StepKPolicy
    from benchmarks.packing.simulator import Simulator, lower_bound_min
    from benchmarks.packing.trace import load_trace

    trace = load_trace(Path(__file__).resolve().parents[1] / "benchmarks/traces/foreign_4x48.yaml")
    oracle = Simulator(trace).run(OraclePolicy(trace))
    assert oracle.oom_events == 0 and oracle.failed_jobs == 0
    assert lower_bound_min(trace) <= oracle.makespan_min <= 1.05 * lower_bound_min(trace)
    policy = StepKPolicy(trace, known_after_s=30.0)
    step_k = Simulator(trace).run(policy)
    assert step_k.failed_jobs == 0 and step_k.makespan_min >= oracle.makespan_min
    assert policy.shapes  # completions replaced the running peaks
    # the headline row (with the model of the LoRA estimate): near the oracle, few OOMs
    headline = Simulator(trace).run(EstimatePolicy(trace, known_after_s=30.0))
    assert headline.failed_jobs == 0 and headline.makespan_min <= 1.03 * oracle.makespan_min
    assert headline.oom_lost_gpu_min <= 0.005 * sum(j.minutes[0] for j in trace.jobs)


def test_forgetting_a_shape_of_live_attempts(orch_inproc, db_path) -> None:  # type: ignore[no-untyped-def]
    from orchestrator.plans import expand_jobs, load_suite, parse_pairs
    from orchestrator.prediction.job_facts import JobShapeCache, attempt_shape_key
    from orchestrator.store.attempts import start_attempt
    from orchestrator.store.db import Store
    from orchestrator.store.jobs import submit_jobs
    from orchestrator.store.learning import record_throughput
    from orchestrator.store.queue import live_attempts_with_jobs

    plans = Path(__file__).resolve().parents[1] / "plans"
    with Store(db_path) as store:
        suite = load_suite("demo", plans)
        submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:glue_rte"), {}, None, 0), allowed_gpus=None,
                    priority=0, force=False, dry_run=False)  # fmt: skip
        job_id = job_ids(store)[0]
        plan = declared_plan(job_id)
        start_attempt(store, plan, lambda n: db_path.parent / f"run-{n}")
        live, jobs = live_attempts_with_jobs(store)
        key = attempt_shape_key(jobs[job_id], live[0], JobShapeCache())
    # before step K: nothing learned, but the attempt's held memory counts; the error says so
    result = orch_inproc("memory", "forget", key)
    assert result.rc == 2 and "learned nothing yet" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    with Store(db_path) as store:
        record_throughput(store, "GPU-0", key, 1, 10.0, "demo")
    result = orch_inproc("memory", "forget", key, "--json")
    assert result.rc == 0 and json.loads(result.stdout)["still_running"] == [key]
    with Store(db_path) as store:
        record_throughput(store, "GPU-0", key, 1, 10.0, "demo")
    assert orch_inproc("memory", "forget", "--suite", "demo").stdout.strip() == (
        "forgot 1 shape(s); 1 of them still has running attempts, whose peak counts until they end")


def test_a_prediction_source_has_no_parentheses_of_its_own() -> None:
    # the start event puts it in parentheses: `predicted 17.9 GiB (measured: level 0 peak)`
    from orchestrator.store.peak_source import PredictionSource, SourceKind

    sources = [PredictionSource(SourceKind.RUNNING, step=3), PredictionSource(SourceKind.LEVEL, level=0),
               PredictionSource(SourceKind.TASK, task="rte", task_tokens=100, tokens=150),
               PredictionSource(SourceKind.FAMILY, points=3, error=0.05).with_cap(),
               PredictionSource(SourceKind.OOM_FLOOR, level=1), PredictionSource(SourceKind.ESTIMATE, tokens=512)]
    texts = [s.render() for s in sources]
    assert not any("(" in t or ")" in t for t in texts), texts
    assert (
        texts[1] == "measured: level 0 peak"
        and texts[3] == "family fit: 3 members, error 5 %, capped at the largest card"
    )
