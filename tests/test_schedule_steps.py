"""The deciding steps of a scheduling pass (scheduling.pack_inputs, scheduling.waits), from
plain values: no database, no tmux."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.lifecycle import JobState
from orchestrator.prediction.durations import CompletedRun, DurationTable
from orchestrator.prediction.job_facts import JobFacts, JobShapeCache, job_shape_key, shape_facts
from orchestrator.prediction.ladder import Level, expand_levels, load_ladder
from orchestrator.prediction.learned import Knowledge
from orchestrator.prediction.shapes import RunningPeak
from orchestrator.scheduling.pack_inputs import (
    PackInputs,
    PassReadings,
    claim_plans,
    host_running_peaks,
    pack_inputs,
    with_teaching,
)
from orchestrator.scheduling.packing.pack import PackingDecision, Placement
from orchestrator.scheduling.packing.types import QueuedJob
from orchestrator.scheduling.queue_kinds import kind_of
from orchestrator.scheduling.state import QueuedJobFacts
from orchestrator.scheduling.waits import changed_wait_reasons, rows_to_explain
from orchestrator.store.peak_source import PredictionSource, SourceKind
from orchestrator.store.rows import Attempt, Job, QueueEntry, ShapeMemory

CONFIG: dict[str, Any] = {"batch_size": 8, "gradient_accumulation_steps": 1}


def a_job(job_id: int, **changes: Any) -> Job:
    config = changes.pop("config", CONFIG)
    job = Job(
        id=job_id, identity=f"i{job_id}", suite="s", config_name="c", config_path="/nonexistent/c.yaml",
        config_json=json.dumps(config), seed=job_id, data="d", worker="script", declared_mib=4096, priority=0,
        state=JobState.QUEUED, level=0, attempt_count=0, max_attempts=8, one_token=False, hang_timeout_s=600.0,
        queued_at=float(job_id), created_at=0.0, updated_at=0.0, crash_loop_failures=0, crash_loop_within_s=60.0,
        crash_loop_window_s=600.0, gpus=1, config=dict(config),
    )
    return replace(job, **changes)


def entry(job: Job, **changes: Any) -> QueueEntry:
    row = QueueEntry(job.id, job.suite, job.priority, job.level, job.host_steps_json, job.queued_at,
                     job.config_name, job.data, job.wait_reason)
    return replace(row, **changes)


LEVEL = expand_levels(load_ladder(None), CONFIG, False)[0]


def facts_for(job: Job, cache: JobShapeCache, level: Level = LEVEL, **kw: Any) -> JobFacts:
    return JobFacts(key=(job.level, job.host_steps_json), level=level, shape=shape_facts(job, level, cache),
                    allowed=job.allowed_gpus, gpus=job.gpus, **kw)


def readings(**kw: Any) -> PassReadings:
    shapes = kw.pop("shapes", {})
    base: dict[str, Any] = {
        "shapes": shapes, "prompt_lengths": {}, "knowledge": Knowledge(shapes, {}), "durations": DurationTable(),
        "curves": {}, "by_family": {}, "host_shapes": {}, "host_running": {},
    }
    return PassReadings(**{**base, **kw})


def test_jobs_of_one_kind_share_their_inputs_and_a_job_without_facts_is_left_out() -> None:
    cache = JobShapeCache()
    first, second, invalid = a_job(1), a_job(2), a_job(3)
    shared = facts_for(first, cache)  # seeds of one sweep share one facts object
    facts_of = {1: shared, 2: shared}
    inputs = pack_inputs([entry(first), entry(second), entry(invalid)], facts_of, readings(), cache, None)
    assert [q.job_id for q in inputs.queue] == [1, 2]
    assert inputs.predictions[1] is inputs.predictions[2]  # worked out once for the kind
    assert inputs.predictions[1][0] == 4096 and inputs.predictions[1][1].kind is SourceKind.DECLARED
    assert inputs.firsts == []  # only the head was read: no teaching


def test_a_measured_peak_learned_host_memory_and_run_time_reach_the_queued_job() -> None:
    cache = JobShapeCache()
    job = a_job(1, declared_mib=1024)
    key = job_shape_key(job, LEVEL)
    durations = DurationTable([CompletedRun("c", "d", 0, 300.0)])
    inputs = pack_inputs([entry(job)], {1: facts_for(job, cache)},
                         readings(shapes={key: ShapeMemory(6000, None, 1)}, host_shapes={key: 2048},
                                  durations=durations), cache, None)
    queued = inputs.queue[0]
    assert queued.predicted_peak_mib >= 6000 and inputs.predictions[1][1].kind is SourceKind.MEASURED
    assert queued.host_mib == inputs.host_predictions[1] == 2048
    assert queued.expected_duration_s == 300.0
    # its margin over the measured peak is what the card's headroom covers (packing.cards.headroom_for)
    assert queued.margin_mib == queued.predicted_peak_mib - 6000 > 0


def test_only_a_peak_measured_to_completion_gives_its_margin_to_the_headroom() -> None:
    cache = JobShapeCache()
    job = a_job(1, declared_mib=1024)
    key = job_shape_key(job, LEVEL)
    running = Knowledge({}, {key: RunningPeak(6000, 12)})
    inputs = pack_inputs([entry(job)], {1: facts_for(job, cache)}, readings(knowledge=running), cache, None)
    # a running attempt's early peak may still grow (its margin is growth, not slack); a declared figure has none
    assert inputs.predictions[1][1].kind is SourceKind.RUNNING and inputs.queue[0].margin_mib == 0
    declared = pack_inputs([entry(job)], {1: facts_for(job, JobShapeCache())}, readings(), JobShapeCache(), None)
    assert declared.queue[0].margin_mib == 0
    # a shared base's process counts its memory apart from the job's own peak: no margin given
    lora = a_job(2, worker="lora", worker_output={"share_base": "sequential"})
    measured = {job_shape_key(lora, LEVEL): ShapeMemory(6000, None, 1)}
    shared = pack_inputs([entry(lora)], {2: facts_for(lora, cache)}, readings(shapes=measured), cache, None)
    assert shared.predictions[2][1].kind is SourceKind.MEASURED and shared.queue[0].margin_mib == 0


def test_kinds_split_by_priority_and_each_kind_counts_its_queued_jobs() -> None:
    cache = JobShapeCache()
    low, high = a_job(1), a_job(2, priority=5)
    facts = facts_for(low, cache)
    queued = {kind_of(facts, entry(low)): [low, a_job(3), a_job(4)]}  # three of the low kind; high: none read
    inputs = pack_inputs([entry(low), entry(high)], {1: facts, 2: facts}, readings(), cache, queued)
    assert [(job_id, count) for job_id, _, count in inputs.firsts] == [(1, 3), (2, 1)]
    assert [group for _, group, _ in inputs.firsts] == [None, None]  # not LoRA: nothing to teach


def test_teaching_marks_only_the_chosen_jobs() -> None:
    queue = [QueuedJob(job_id=i, priority=0, queued_seq=i, predicted_peak_mib=1, waiting_since_s=0.0) for i in (1, 2)]
    marked = with_teaching(queue, {2})
    assert [q.teaches for q in marked] == [False, True]


def test_host_running_peaks_keep_the_largest_per_shape() -> None:
    def attempt(attempt_id: int, job_id: int, host_peak_mib: int) -> Attempt:
        return Attempt(id=attempt_id, job_id=job_id, n=1, gpu_index=0, gpu_uuid="u", level=0, run_dir="/r",
                       predicted_peak_mib=0, prediction_source="none", reserved_mib=0, held_mib=0, peak_mib=0,
                       reached_peak=False, started_at=0.0, run_alone=False, predicted_host_mib=0,
                       host_held_mib=0, host_peak_mib=host_peak_mib)

    jobs = {1: a_job(1), 2: a_job(2)}
    live = [attempt(10, 1, 500), attempt(11, 2, 900), attempt(12, 99, 5000)]  # 99: its job was not read
    assert host_running_peaks(live, jobs, lambda job, a: "shape") == {"shape": 900}


def gpu(index: int) -> GpuSnapshot:
    return GpuSnapshot(index=index, uuid=f"GPU-{index}", name="card", total_mib=24576, used_mib=0, free_mib=24576)


def test_claims_record_the_prediction_or_the_cap_and_a_gangs_cards_in_order() -> None:
    cache = JobShapeCache()
    plain, capped, gang = a_job(1), a_job(2), a_job(3, gpus=2)
    facts_of = {j.id: facts_for(j, cache) for j in (plain, capped, gang)}
    measured = PredictionSource(SourceKind.MEASURED)
    inputs = PackInputs([], {1: (5000, measured), 2: (90000, measured), 3: (7000, measured)}, {1: 0, 2: 0, 3: 1024}, [])
    decision = PackingDecision((
        Placement(1, 0, 5000),
        Placement(2, 1, 24000, capped=True),
        Placement(3, 1, 7000, gpu_indices=(1, 0)),
    ))
    plans = claim_plans(decision, inputs, facts_of, (gpu(0), gpu(1)))
    assert [(p.job_id, p.predicted_mib, p.reserved_mib) for p in plans] == [(1, 5000, 5000), (2, 24000, 24000),
                                                                             (3, 7000, 7000)]
    assert plans[0].source == measured and plans[1].source == measured.with_cap()
    assert [c.index for c in plans[2].cards] == [1, 0] and plans[2].gpu.index == 1 and plans[2].host_mib == 1024
    assert plans[0].cards == (gpu(0),)


def test_a_whole_queue_pass_explains_every_handed_job_and_those_whose_reason_left() -> None:
    handed = [entry(a_job(1)), entry(a_job(2))]
    left = [entry(a_job(7), wait_reason="old")]
    assert rows_to_explain(handed, {1: "r"}, whole_queue=True, reason_left=left) == [*handed, *left]
    # a pass over the head only rewrites the reasons `pack` gave; the rest keep theirs
    assert rows_to_explain(handed, {1: "r"}, whole_queue=False) == handed[:1]


def test_only_changed_reasons_of_unplaced_jobs_are_written() -> None:
    rows = [entry(a_job(1), wait_reason="same"), entry(a_job(2), wait_reason="old"), entry(a_job(3), wait_reason="x"),
            entry(a_job(4), wait_reason="stale")]
    reasons = {1: "same", 2: "new", 3: "y"}
    assert changed_wait_reasons(rows, reasons, placed={3}) == [("new", 2), (None, 4)]


def test_an_untaught_lora_kind_names_its_group_until_its_prompt_lengths_are_learned() -> None:
    cache = JobShapeCache()
    job = a_job(1, worker="lora")
    facts = facts_for(job, cache)
    untaught = pack_inputs([entry(job)], {1: facts}, readings(), cache, {})
    assert untaught.firsts == [(1, facts.shape.length_key, 1)]
    taught = pack_inputs([entry(job)], {1: facts}, readings(prompt_lengths={facts.shape.length_key: 300}), cache, {})
    assert taught.firsts == [(1, None, 1)]


def test_queued_job_facts_share_one_object_per_kind_and_forget_jobs_that_left() -> None:
    cache = JobShapeCache()
    known = QueuedJobFacts()
    first = known.share(facts_for(a_job(1), cache))
    again = known.share(facts_for(a_job(2), cache))  # seeds alike: their facts are equal
    assert again is first and len(known.pool) == 1
    other = known.share(facts_for(a_job(3, gpus=2), cache))
    known.by_job = {1: first, 2: first, 3: other}
    known.forget([2])
    known.keep_only({1, 3, 4})
    assert set(known.by_job) == {1, 3}
    known.forget([3])
    known.trim_pool()
    assert list(known.pool.values()) == [first]
    cache.keep_shapes(f.shape for f in known.pool.values())
    assert list(cache.shapes.values()) == [first.shape]
