"""Fused groups of one adapter shape, else of like work: the packer deals a fused group's jobs that
have no run time into runs of its cap (a card fills its processes in placement order). Members that
stack together (one adapter spec and micro-batch) go together, so that a process launches each of
its LoRA layers' adapters once for all of them; what is left is dealt into runs whose work per tick
is alike."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.prediction.fused_groups import (
    BASE_MODULE_WORK,
    DEFAULT_TARGETS,
    member_stack,
    member_work,
)
from orchestrator.scheduling.packing.fused import balanced, in_runs_by_stack_then_work
from orchestrator.scheduling.packing.types import QueuedJob
from tests.test_packing import GIB, job

ALL_SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def member(job_id: int, work: float, cap: int = 4, group: str = "g", **kw: object) -> QueuedJob:
    return job(job_id, 4, fuse_group=group, fuse_cap=cap, fuse_work=work, **kw)


def works(jobs: list[QueuedJob]) -> list[float]:
    return [j.fuse_work for j in jobs]


def stacks(jobs: list[QueuedJob]) -> list[str | None]:
    return [j.fuse_stack for j in jobs]


def test_members_stack_together_where_their_micro_batch_and_adapter_spec_agree() -> None:
    qv = {"r": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]}
    key = member_stack({"batch_size": 16, "learning_rate": 3e-4}, qv)
    assert key == member_stack({"batch_size": 16, "learning_rate": 1e-3}, qv)  # the rate is its own
    assert key == member_stack({"batch_size": 16}, {"lora_alpha": 16, "r": 8, "target_modules": ["q_proj", "v_proj"]})
    assert key != member_stack({"batch_size": 8}, qv)  # other rows: a stack of its own
    assert key != member_stack({"batch_size": 16}, qv | {"r": 16})
    assert key != member_stack({"batch_size": 16}, qv | {"dropout": 0.1})
    # a spec file orch cannot read from here: one file, one spec; no spec: the worker's default
    named = {"batch_size": 16, "peft": "../../peft/qv.json"}
    assert member_stack(named, None) == member_stack(dict(named), None)
    assert member_stack(named, None) != member_stack(named | {"peft": "kv.json"}, None)
    assert member_stack({"batch_size": 16}, None) == member_stack({"batch_size": 16, "seed": 2}, None)
    assert member_stack({"batch_size": 16, "peft": 3}, None) is None  # not a spec: stacks with none


def test_a_members_work_is_its_rows_times_the_base_and_its_adapted_modules() -> None:
    light = member_work({"batch_size": 16}, {"r": 8, "targets": ["q_proj", "v_proj"]})
    heavy = member_work({"batch_size": 16}, {"r": 4, "target_modules": ALL_SEVEN})
    assert light == 16 * (BASE_MODULE_WORK + 2)
    assert heavy == 16 * (BASE_MODULE_WORK + 7)
    assert member_work({"batch_size": 8}, {"targets": ALL_SEVEN}) == heavy / 2  # half the rows
    # a spec it cannot read (a file, a pattern) counts as the worker's default four
    assert member_work({"batch_size": 16}, None) == 16 * (BASE_MODULE_WORK + DEFAULT_TARGETS)
    assert member_work({"batch_size": 16}, {"target_modules": "all-linear"}) == heavy  # a Llama layer's seven
    assert member_work({"batch_size": 16}, {"target_modules": ".*proj"}) == 16 * (BASE_MODULE_WORK + 4)
    assert member_work({"per_device_train_batch_size": 8}, {"targets": ALL_SEVEN}) == heavy / 2  # its batch key
    assert member_work({}, {"targets": ["q_proj"]}) == BASE_MODULE_WORK + 1  # no batch size: one row


def test_a_sweeps_configs_one_after_another_are_dealt_into_runs_of_like_work() -> None:
    # 4 configs x 4 seeds in queue order (config-major), cap 4: queue order would give one process
    # the four heaviest
    queue = [member(n + 1, w) for n, w in enumerate([9.0] * 4 + [11.0] * 4 + [9.0] * 4 + [14.0] * 4)]
    arranged = in_runs_by_stack_then_work(queue, 4)
    assert sorted(j.job_id for j in arranged) == list(range(1, 17))
    runs = [arranged[n:n + 4] for n in range(0, 16, 4)]
    assert [sum(works(run)) for run in runs] == [43.0] * 4
    # heaviest first, then lightest first: neighbours across a run's edge are of like work
    assert works(runs[0]) == [14.0, 11.0, 9.0, 9.0]
    assert works(runs[1]) == [9.0, 9.0, 11.0, 14.0]
    # ties keep their order: each run's first light seed before its second
    assert [j.job_id for j in runs[0]] == [13, 5, 1, 9]


def stacked(job_id: int, stack: str, work: float = 9.0, cap: int = 4, **kw: object) -> QueuedJob:
    return member(job_id, work, cap, fuse_stack=stack, **kw)


def test_a_sweeps_configs_of_one_adapter_shape_each_fill_processes_of_their_own() -> None:
    # the H200 sweep: 4 configs x 4 seeds, config-major; two configs differ only in their learning
    # rate, so they stack together. Mixed, each process would launch every shape's adapters
    shapes = ["qv"] * 4 + ["qkvo"] * 4 + ["qv"] * 4 + ["all"] * 4
    weights = {"qv": 9.0, "qkvo": 11.0, "all": 14.0}
    queue = [stacked(n + 1, shape, weights[shape]) for n, shape in enumerate(shapes)]
    arranged = in_runs_by_stack_then_work(queue, 4)
    assert sorted(j.job_id for j in arranged) == list(range(1, 17))
    runs = [arranged[n:n + 4] for n in range(0, 16, 4)]
    assert [set(stacks(run)) for run in runs] == [{"all"}, {"qkvo"}, {"qv"}, {"qv"}]  # heaviest first
    assert [j.job_id for j in runs[2]] == [1, 2, 3, 4] and [j.job_id for j in runs[3]] == [9, 10, 11, 12]


def test_a_teaching_jobs_process_takes_its_stack_mates_first() -> None:
    shapes = ["qv"] * 4 + ["all"] * 4
    queue = [stacked(n + 1, shape, 14.0 if shape == "all" else 9.0, teaches=n == 0) for n, shape in enumerate(shapes)]
    arranged = balanced(queue)
    assert arranged[0].job_id == 1  # it keeps its place
    assert stacks(arranged[:4]) == ["qv"] * 4 and stacks(arranged[4:]) == ["all"] * 4


def test_a_pinned_jobs_run_is_filled_with_its_stack_mates_before_whole_runs_are_dealt() -> None:
    # cap 4: the teaching qv job's run takes the three other qv jobs; dealt by whole runs and work
    # alone, two qv jobs would land elsewhere
    queue = [stacked(1, "qv", 9.0, teaches=True), *[stacked(n, "qv", 9.0) for n in (2, 3, 4)],
             stacked(5, "a", 14.0), stacked(6, "a", 14.0), *[stacked(n, "b", 11.0) for n in (7, 8, 9)]]
    arranged = balanced(queue)
    assert arranged[0].job_id == 1 and stacks(arranged[:4]) == ["qv"] * 4
    assert sorted(stacks(arranged[4:]), key=str) == ["a", "a", "b", "b", "b"]


def test_a_pinned_jobs_stack_mate_joins_it_though_every_free_job_is_of_one_work() -> None:
    # cap 2: every free job does the same work and no two free ones stack; one stacks with the
    # pinned job and joins its process
    queue = [stacked(1, "qv", cap=2, teaches=True), stacked(2, "all", cap=2), stacked(3, "kv", cap=2),
             stacked(4, "qv", cap=2)]
    assert stacks(balanced(queue)[:2]) == ["qv", "qv"]


def test_what_is_left_after_whole_runs_keeps_stack_mates_together_and_evens_the_work() -> None:
    # cap 4, 12 jobs: "d" fills a run; the pairs left share two runs, each pair in one run
    queue = ([stacked(n, "d", 8.0) for n in range(1, 7)] + [stacked(7, "a", 12.0), stacked(8, "a", 12.0)]
             + [stacked(9, "b", 10.0), stacked(10, "b", 10.0), stacked(11, "c", 2.0), stacked(12, "c", 2.0)])
    arranged = in_runs_by_stack_then_work(queue, 4)
    runs = [arranged[n:n + 4] for n in range(0, 12, 4)]
    assert stacks(runs[0]) == ["d"] * 4
    pairs = [sorted(set(stacks(run)), key=str) for run in runs[1:]]
    assert sorted(pairs) == [["a", "c"], ["b", "d"]]  # 12+12+2+2 = 28 beside 10+10+8+8 = 36
    assert all(stacks(run).count(key) == 2 for run in runs[1:] for key in set(stacks(run)))


def test_an_uneven_count_leaves_the_last_run_short_and_the_work_spread() -> None:
    queue = [member(n + 1, w) for n, w in enumerate([1.0, 1.0, 1.0, 5.0, 5.0, 5.0, 9.0])]
    arranged = in_runs_by_stack_then_work(queue, 3)
    runs = [arranged[0:3], arranged[3:6], arranged[6:]]
    assert [len(r) for r in runs] == [3, 3, 1]
    assert max(sum(works(r)) for r in runs) <= 11.0  # never a run of 9 + 5 + 5 (19)


def test_only_a_groups_jobs_without_a_run_time_move_and_only_among_their_own_places() -> None:
    queue = [
        member(1, 9.0, 2), member(2, 9.0, 2), member(3, 2.0, 2),
        job(4, 4),  # not fused
        member(5, 2.0, 2),
        member(7, 9.0, 2, expected_duration_s=30.0),  # has a run time: longest-first order stands
        member(8, 9.0, 2, group="other"),  # another group
        member(9, 2.0, cap=1),  # trains alone (sequential)
    ]
    arranged = [j.job_id for j in balanced(queue)]
    assert (arranged[3], arranged[5:]) == (4, [7, 8, 9])
    moved = [arranged[i] for i in (0, 1, 2, 4)]
    assert moved == [1, 3, 5, 2]  # (9, 2), then (2, 9)


def test_a_job_that_teaches_keeps_its_place_and_counts_in_its_run() -> None:
    # the sweep's first job teaches its kind's prediction: it stays first, and the runs stay
    # aligned with the processes (four members each), every one of like work
    queue = [member(n + 1, w, teaches=n == 0)
             for n, w in enumerate([9.0] * 4 + [11.0] * 4 + [9.0] * 4 + [14.0] * 4)]
    arranged = balanced(queue)
    assert arranged[0].job_id == 1
    assert [sum(works(arranged[n:n + 4])) for n in range(0, 16, 4)] == [43.0] * 4


def test_jobs_with_a_run_time_keep_their_places_and_count_in_their_runs() -> None:
    # fifo order: the group's jobs that have a run time sit among the others; the runs still line
    # up with the processes the card fills in this order
    queue = [member(1, 9.0, expected_duration_s=30.0), member(2, 9.0), member(3, 14.0), member(4, 9.0),
             member(5, 14.0), member(6, 14.0, expected_duration_s=30.0), member(7, 9.0), member(8, 14.0)]
    arranged = balanced(queue)
    assert (arranged[0].job_id, arranged[5].job_id) == (1, 6)
    assert [sum(works(arranged[n:n + 4])) for n in (0, 4)] == [46.0, 46.0]


def test_jobs_all_of_one_work_keep_the_packing_order() -> None:
    queue = [member(n, 9.0) for n in (3, 1, 2, 5, 4)]
    assert balanced(queue) == queue


def _suite(plans: Path) -> None:
    (plans / "configs" / "fz").mkdir(parents=True)
    (plans / "suites").mkdir(parents=True)
    for name, targets in (("light", ["q_proj", "v_proj"]), ("heavy", ALL_SEVEN)):
        config = {"model": "tiny-llama", "batch_size": 2, "peft": {"targets": targets}}
        (plans / "configs" / "fz" / f"{name}.yaml").write_text(yaml.safe_dump(config))
    suite = {"worker": "lora", "mem_gib": 1, "configs": ["light", "heavy"], "share_base": "fused",
             "fused_members": 2}
    (plans / "suites" / "fz.yaml").write_text(yaml.safe_dump(suite))


def test_the_daemons_pass_starts_a_config_major_sweep_in_processes_of_one_adapter_shape(tmp_path: Path) -> None:
    from orchestrator.plans import GpuPlan, expand_jobs, load_suite, parse_pairs
    from orchestrator.prediction.job_facts import JobShapeCache, job_levels, job_shape_key
    from orchestrator.scheduling.dispatch import DispatchContext, schedule
    from orchestrator.scheduling.packing.types import PackingPolicy
    from orchestrator.scheduling.state import SchedulerState
    from orchestrator.store import Store
    from orchestrator.store.attempts import write_shape
    from orchestrator.store.jobs import set_gpu_plan, submit_jobs
    from orchestrator.store.rows import ShapeMemory
    from orchestrator.store.sweep_attempts import all_attempts
    from tests.store_reads import read_jobs
    from tests.test_scale import _Recorder

    _suite(tmp_path / "plans")
    suite = load_suite("fz", tmp_path / "plans")
    store = Store(tmp_path / "state.db")
    set_gpu_plan(store, GpuPlan(slots_by_gpu={}, default_slots=4))
    submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:toy 2:toy 3:toy 4:toy"), {}, None, 0),
                allowed_gpus=None, priority=0, force=False, dry_run=False)  # fmt: skip
    jobs = read_jobs(store)
    configs = {j.id: j.config_name for j in jobs}
    assert [configs[j] for j in sorted(configs)] == ["light"] * 4 + ["heavy"] * 4  # config-major
    for queued in jobs:  # each config's memory measured: no probe holds the others back
        write_shape(store, job_shape_key(queued, job_levels(queued, JobShapeCache())[0]),
                    ShapeMemory(2 * GIB, None, 1))
    card = (GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=80 * GIB, used_mib=0,
                        free_mib=80 * GIB, processes=()),)  # fmt: skip
    launched = _Recorder()
    schedule(store, card, launched, DispatchContext(tmp_path / "runs", PackingPolicy(), {}), SchedulerState(),
             draining=False)  # fmt: skip
    attempts = sorted(all_attempts(store), key=lambda a: a.id)
    store.close()
    started = [configs[a.job_id] for a in attempts]
    assert len(started) == 8
    # launched in this order, each pair (one process of cap 2) of one config (its adapters stack)
    assert [started[n:n + 2] for n in range(0, 8, 2)] == [["heavy"] * 2] * 2 + [["light"] * 2] * 2
    # each pair is one process, named by the attempt that opened it: its client joins only that one
    pairs = [attempts[n:n + 2] for n in range(0, 8, 2)]
    assert [(a.fuse_process, b.fuse_process) for a, b in pairs] == [(a.id, a.id) for a, _ in pairs]
    names = {spec.attempt_id: spec.env.get("ORCH_FUSE_PROCESS") for spec in launched.specs}
    assert names == {a.id: str(a.fuse_process) for a in attempts}


def test_the_daemons_pass_places_a_sweeps_first_joiners_for_their_estimate_less_the_base(tmp_path: Path) -> None:
    """Before any share.json, a joiner of a model whose shape orch reads (its config.json) is placed
    for its estimate less the base's weights and context as the estimate counts them."""
    import json

    from orchestrator.plans import GpuPlan, expand_jobs, load_suite, parse_pairs
    from orchestrator.prediction.memory import estimated_base_mib, model_info_from_hf_config
    from orchestrator.scheduling.dispatch import DispatchContext, schedule
    from orchestrator.scheduling.packing.types import PackingPolicy
    from orchestrator.scheduling.state import SchedulerState
    from orchestrator.store import Store
    from orchestrator.store.jobs import set_gpu_plan, submit_jobs
    from orchestrator.store.sweep_attempts import all_attempts
    from tests.test_scale import _Recorder

    shape = {"hidden_size": 2048, "num_hidden_layers": 24, "intermediate_size": 5632, "vocab_size": 32000,
             "num_attention_heads": 16, "model_type": "llama"}
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(shape))
    plans = tmp_path / "plans"
    (plans / "configs" / "fz").mkdir(parents=True)
    (plans / "suites").mkdir(parents=True)
    config = {"model": str(model), "batch_size": 4, "prec": "bf16", "peft": {"targets": ["q_proj", "v_proj"]}}
    (plans / "configs" / "fz" / "c.yaml").write_text(yaml.safe_dump(config))
    (plans / "suites" / "fz.yaml").write_text(yaml.safe_dump(
        {"worker": "lora", "mem_gib": 1, "configs": ["c"], "share_base": "fused", "fused_members": 3}))
    suite = load_suite("fz", plans)
    store = Store(tmp_path / "state.db")
    set_gpu_plan(store, GpuPlan(slots_by_gpu={}, default_slots=4))
    submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:toy 2:toy 3:toy"), {}, None, 0),
                allowed_gpus=None, priority=0, force=False, dry_run=False)  # fmt: skip
    card = (GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=80 * GIB, used_mib=0,
                        free_mib=80 * GIB, processes=()),)  # fmt: skip
    schedule(store, card, _Recorder(), DispatchContext(tmp_path / "runs", PackingPolicy(), {}), SchedulerState(),
             draining=False)  # fmt: skip
    attempts = sorted(all_attempts(store), key=lambda a: a.id)
    store.close()
    base = estimated_base_mib(config, model_info_from_hf_config(shape))
    assert base is not None and len(attempts) == 3
    estimate = attempts[0].predicted_peak_mib
    assert attempts[0].prediction_source.startswith("estimate") and estimate > base
    assert [a.reserved_mib for a in attempts] == [estimate, estimate - base, estimate - base]
