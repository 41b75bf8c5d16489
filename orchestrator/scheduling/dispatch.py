"""One scheduling pass: queued jobs and live attempts from the store + GPU snapshots -> `pack`
-> attempts started. The policy itself is the pure `orchestrator.scheduling.packing.pack.pack`."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.errors import InvalidTransition, OrchError
from orchestrator.executors.base import Executor
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.lifecycle import JobState
from orchestrator.plans import DEFAULT_SLOTS, GpuPlan
from orchestrator.prediction.durations import CompletedRun, DurationTable
from orchestrator.prediction.job_facts import (
    JobFacts,
    JobShapeCache,
    as_received,
    attempt_config,
    attempt_shape_key,
    job_prompt_length_key,
    level_of,
    predict_for,
    shape_facts,
)
from orchestrator.prediction.learned import Knowledge, held_peaks, running_peaks, throughput_curves
from orchestrator.prediction.throughput import family_curves
from orchestrator.scheduling.family_inputs import curve_of, family_tags, mark_probes, probe_family
from orchestrator.scheduling.launching import DispatchContext, claim, launch_all
from orchestrator.scheduling.packing.pack import PackingDecision, can_take_any, open_slots, pack
from orchestrator.scheduling.packing.types import GpuState, QueuedJob
from orchestrator.scheduling.queue_index import QueueRead
from orchestrator.scheduling.queue_kinds import Kind, handed_to_pack, kind_of
from orchestrator.scheduling.resources import host_state, predict_host_mib, running_attempts
from orchestrator.scheduling.state import SchedulerState
from orchestrator.scheduling.teaching import teaching_jobs, untaught
from orchestrator.store.attempts import (
    read_all_prompt_lengths,
    read_all_shapes,
)
from orchestrator.store.db import Store
from orchestrator.store.jobs import get_gpu_plan, transition
from orchestrator.store.learning import read_throughput
from orchestrator.store.peak_source import PredictionSource
from orchestrator.store.queue import (
    jobs_by_id,
    live_attempts_with_jobs,
    queued_jobs,
    queued_jobs_alike,
    succeeded_runs_since,
)
from orchestrator.store.queue import write_wait_reasons as store_wait_reasons
from orchestrator.store.resources import read_host_shapes
from orchestrator.store.rows import Attempt, Job, QueueEntry
from orchestrator.store.status import paused_suites

log = logging.getLogger(__name__)

def load_durations(store: Store) -> DurationTable:
    """Run times of succeeded attempts: longest expected jobs start first."""
    return refresh_durations(store, SchedulerState())


# Attempts are ended by the daemon, one after another, so a succeeded attempt that ended more
# than this long before the latest one read is already in the table.
DURATIONS_OVERLAP_S = 60.0


def refresh_durations(store: Store, state: SchedulerState) -> DurationTable:
    """Add the attempts that succeeded since the last call to the cached run-time table."""
    since = None if state.durations_after_s is None else state.durations_after_s - DURATIONS_OVERLAP_S
    for r in succeeded_runs_since(store, since):
        if r.attempt_id in state.durations_seen:
            continue
        state.durations_seen[r.attempt_id] = r.ended_at
        state.durations.add(CompletedRun(r.config_name, r.data, r.level, r.duration_s))
        if state.durations_after_s is None or r.ended_at > state.durations_after_s:
            state.durations_after_s = r.ended_at
    if state.durations_after_s is not None and len(state.durations_seen) > 1000:
        oldest_s = state.durations_after_s - 2 * DURATIONS_OVERLAP_S
        state.durations_seen = {k: v for k, v in state.durations_seen.items() if v >= oldest_s}
    return state.durations


def gpu_states(snapshots: tuple[GpuSnapshot, ...], plan: GpuPlan) -> list[GpuState]:
    return [
        GpuState(
            index=s.index, uuid=s.uuid, total_mib=s.total_mib, free_mib=s.free_mib,
            slots=plan.slots_for(s.index, DEFAULT_SLOTS),
        )
        for s in snapshots
    ]


def schedule(
    store: Store,
    snapshots: tuple[GpuSnapshot, ...],
    launcher: Executor,
    ctx: DispatchContext,
    state: SchedulerState,
    *,
    draining: bool,
    hold: str | None = None,
) -> PackingDecision:
    """Pack the queue onto the GPUs and start what fits. Returns the decision (for tests).

    When no card has a free slot with free memory, only the head of the queue is read (for its
    waiting reasons): a long queue then costs nothing while it waits. `hold`: why nothing may
    start now (a full disk); every queued job shows it."""
    cache = state.shapes
    paused = {p.suite: p.reason for p in paused_suites(store, count_queued=False)}
    live, live_jobs = live_attempts_with_jobs(store)
    durations = refresh_durations(store, state)
    # one RunningAttempt per card of a multi-GPU attempt, each with its expected end
    running = running_attempts(live, {s.uuid: s.index for s in snapshots}, _expected_end(live_jobs, durations))
    plan = get_gpu_plan(store)
    gpus = gpu_states(snapshots, plan)
    whole_queue = not draining and can_take_any(gpus, running, ctx.policy)
    head: list[QueueEntry] | None = None
    if not whole_queue:  # only the head, for its waiting reasons
        head = state.queue.head(store, ctx.policy.reasons_for)
        if head is None:
            head = queued_jobs(store, limit=ctx.policy.reasons_for)
        if _reasons_still_fresh(state, (tuple(a.id for a in live), plan, tuple(sorted(paused.items())), draining, hold),
                                head, store.now_s()):
            return PackingDecision((), {})
    # Jobs of one kind differ only by their place in the queue, and no pass places more jobs
    # than there are free slots: `pack` gets that many of each kind, and the head of the queue
    # (whose waiting reasons it gives); each kind's prediction is worked out once.
    per_kind = max(1, open_slots(gpus, running, ctx.policy)) if whole_queue else 0
    if whole_queue:
        state.queue.read(store)
        read = state.queue.take_changes()
        _forget_left(state, read)
        entries = state.queue.entries
        if read.whole:
            _learn_new_jobs(store, state.queue.order, cache)
            state.kinds.rebuild(state.queue.order, cache.jobs)
        else:
            _learn_new_jobs(store, [entries[i] for i in read.changed if i in entries], cache)
            state.kinds.add(read.changed, entries, cache.jobs)
        head = state.queue.first(ctx.policy.reasons_for + per_kind)
        queued_rows = handed_to_pack(head, state.kinds.heads(per_kind, entries))
    else:
        assert head is not None
        queued_rows = head
        _learn_new_jobs(store, queued_rows, cache)
    reasons: dict[int, str] = {}
    queue: list[QueuedJob] = []
    shapes = read_all_shapes(store)
    prompt_lengths = read_all_prompt_lengths(store)
    def key_of(job: Job, attempt: Attempt) -> str:
        return attempt_shape_key(job, attempt, cache)

    knowledge = Knowledge(shapes, running_peaks(live, live_jobs, key_of), held_peaks(live, live_jobs, key_of),
                          family_tags(store, live, live_jobs, cache))
    running = mark_probes(running, live, live_jobs, knowledge, cache)
    curves = throughput_curves(read_throughput(store), {s.uuid: s.index for s in snapshots})
    by_family = family_curves(curves, {key: tag.family_key for key, tag in knowledge.tags.items()})
    host_shapes = read_host_shapes(store)
    host_running: dict[str, int] = {}
    for a in live:
        if a.job_id in live_jobs:
            key = attempt_shape_key(live_jobs[a.job_id], a, cache)
            host_running[key] = max(host_running.get(key, 0), a.host_peak_mib)
    predictions: dict[int, tuple[int, PredictionSource]] = {}
    host_predictions: dict[int, int] = {}
    kinds: dict[Kind, _KindInputs] = {}
    firsts: list[tuple[int, str | None, int]] = []  # per kind, in queue order (orchestrator.scheduling.teaching)
    for job in queued_rows:
        facts = cache.jobs.get(job.id)
        if facts is None:  # an invalid ladder: failed by `_learn_new_jobs`
            continue
        kind = kind_of(facts, job)
        inputs = kinds.get(kind)
        if inputs is None:
            predicted = predict_for(facts.shape, facts.shape.job, facts.level, shapes, prompt_lengths, cache, knowledge)
            host_mib, _ = predict_host_mib(
                host_shapes.get(facts.shape.shape_key), host_running.get(facts.shape.shape_key), facts.declared_host_mib)
            inputs = kinds[kind] = _KindInputs(
                predicted, host_mib, durations.expected_s(job.config_name, job.data, facts.level.index),
                curve_of(facts, curves, by_family), probe_family(facts, predicted[1], knowledge))
            if whole_queue:
                firsts.append((job.id, _teaching_group(facts, predicted[1], prompt_lengths),
                               len(state.kinds.lists.get(kind, ())) or 1))
        predictions[job.id] = inputs.prediction
        host_predictions[job.id] = inputs.host_mib
        queue.append(
            QueuedJob(
                job_id=job.id, priority=job.priority, queued_seq=job.id,
                predicted_peak_mib=inputs.prediction[0], waiting_since_s=job.queued_at,
                allowed_gpu_indices=facts.allowed, run_alone=facts.level.run_alone,
                expected_duration_s=inputs.expected_s, throughput_by_gpu=inputs.curve,
                min_stack_gain=facts.min_stack_gain,
                gpus=facts.gpus, host_mib=inputs.host_mib, cpus=facts.cpus, suite=job.suite,
                probe_family=inputs.probe_family,
            )
        )
    teaching = teaching_jobs(firsts, {job_prompt_length_key(j) for j in live_jobs.values() if j.worker == "lora"}) \
        if any(group is not None for _, group, _ in firsts) else set()
    queue = [replace(q, teaches=True) if q.job_id in teaching else q for q in queue]
    host = None
    if ctx.host is not None:
        cpus_of_job = {j.id: j.cpus for j in live_jobs.values()}
        host = host_state(ctx.host.snapshot(), ctx.host_reserve_mib, live, cpus_of_job,
                          any(q.cpus is not None for q in queue))
    decision = pack(queue, gpus, running, ctx.policy, store.now_s(), host=host, topology=ctx.topology,
                    paused=paused, draining=draining, hold=hold)
    reasons.update(decision.wait_reasons)
    placed = jobs_by_id(store, [p.job_id for p in decision.placements])
    by_index = {s.index: s for s in snapshots}
    claims = []
    for placement in decision.placements:
        predicted_mib, source = predictions[placement.job_id]
        if placement.capped:
            predicted_mib, source = placement.reserved_mib, source.with_cap()
        whole, level = placed[placement.job_id], cache.jobs[placement.job_id].level
        # the attempt records its changes as the script receives them (the suite's `keys:`)
        claimed = claim(store, ctx, whole, as_received(whole, level), attempt_config(whole, level),
                        by_index[placement.gpu_index], predicted_mib, source, placement.reserved_mib,
                        tuple(by_index[i] for i in placement.all_gpus), host_predictions[placement.job_id])
        if claimed is not None:
            claims.append(claimed)
    launch_all(store, launcher, ctx, claims)
    if whole_queue:  # those handed to `pack`, and any other whose old reason no longer stands
        handed = {q.job_id for q in queue}
        explained = queued_rows + [state.queue.entries[i] for i in state.queue.with_reason - handed]
    else:
        explained = [r for r in queued_rows if r.id in reasons]
    write_wait_reasons(store, explained, reasons, {p.job_id for p in decision.placements})
    return decision


def _teaching_group(facts: JobFacts, source: PredictionSource, prompt_lengths: Mapping[str, int]) -> str | None:
    """A LoRA job's model and data while its prediction is untaught: one finished run of them
    reports the prompt lengths that size every config of that model and data."""
    shape = facts.shape
    if shape.job.worker != "lora" or not untaught(source, shape.length_key in prompt_lengths):
        return None
    return shape.length_key


WAITING_REFRESH_S = 5.0  # while nothing can start, the head's waiting reasons are this old at most


def _reasons_still_fresh(state: SchedulerState, key: tuple[Any, ...], head: list[QueueEntry], now_s: float) -> bool:
    """While no card can take anything, the head's waiting reasons are worked out again only
    when what they rest on changed (`key`: the running attempts, the plan, pauses, draining, a
    hold; or the head's rows) or WAITING_REFRESH_S has passed: free memory in them may be that
    old. Nothing could start either way, so a pass skipped here places nothing."""
    last = state.waiting_checked
    rows = tuple(head)
    if last is not None and last[0] == key and last[1] == rows and now_s - last[2] < WAITING_REFRESH_S:
        return True
    state.waiting_checked = (key, rows, now_s)
    return False


@dataclass(frozen=True)
class _KindInputs:
    """What one pass works out once per kind of queued job."""

    prediction: tuple[int, PredictionSource]
    host_mib: int
    expected_s: float | None
    curve: Mapping[int, Mapping[int, float]] | None
    probe_family: str | None = None


def _forget_left(state: SchedulerState, read: QueueRead) -> None:
    """Drop the facts of jobs that left the queue, and shapes no queued job has."""
    cache = state.shapes
    if read.whole:
        cache.jobs = {k: v for k, v in cache.jobs.items() if k in state.queue.entries}
    else:
        for job_id in read.left:
            cache.jobs.pop(job_id, None)
    if len(cache.shapes) + len(cache.facts_pool) > 2 * len(cache.jobs) + 100:
        kept = {id(f) for f in cache.jobs.values()}
        cache.facts_pool = {k: f for k, f in cache.facts_pool.items() if id(f) in kept}
        kept_shapes = {id(f.shape) for f in cache.facts_pool.values()}
        cache.shapes = {k: v for k, v in cache.shapes.items() if id(v) in kept_shapes}


def _expected_end(
    live_jobs: Mapping[int, Job], durations: DurationTable
) -> Callable[[Attempt], float | None]:
    """When a live attempt is expected to end: its start plus the learned run time of its kind."""
    def end(a: Attempt) -> float | None:
        job = live_jobs.get(a.job_id)
        expected = durations.expected_s(job.config_name, job.data, a.level) if job else None
        return None if expected is None else a.started_at + expected
    return end


def _declared_host_mib(job: Job) -> int | None:
    """The config's `host_mem_gib` (RAM of the whole process tree), when it gives a number."""
    value = job.config.get("host_mem_gib")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 65536:
        return None
    return round(value * 1024)


def _learn_new_jobs(store: Store, rows: list[QueueEntry], cache: JobShapeCache) -> None:
    """Level and shape facts for jobs not seen before, or whose level or host steps changed;
    a job whose ladder cannot be expanded fails here."""
    stale = [r.id for r in rows if (f := cache.jobs.get(r.id)) is None or f.key != (r.level, r.host_steps_json)]
    if not stale:
        return
    # Seeds of a sweep share their facts: one job of each group is read whole and learned, the
    # rest take its (one object; the facts hold nothing of a job's own).
    for alike in queued_jobs_alike(store, stale):
        job = jobs_by_id(store, alike[:1]).get(alike[0])
        if job is None or job.state is not JobState.QUEUED:
            continue
        try:
            level = level_of(job, cache)
        except OrchError as exc:
            for job_id in alike:
                cache.jobs.pop(job_id, None)
            for failed in jobs_by_id(store, alike).values():
                fail_queued(store, failed, f"invalid ladder: {exc}")
            continue
        facts = JobFacts(
            key=(job.level, job.host_steps_json), level=level, shape=shape_facts(job, level, cache),
            allowed=job.allowed_gpus, gpus=job.gpus, cpus=job.cpus, declared_host_mib=_declared_host_mib(job),
            min_stack_gain=job.min_stack_gain,
        )
        facts = cache.facts_pool.setdefault(facts.pool_key, facts)
        for job_id in alike:
            cache.jobs[job_id] = facts


def fail_queued(store: Store, job: Job, reason: str) -> None:
    with contextlib.suppress(InvalidTransition):
        transition(store, job.id, JobState.FAILED, message=f"failed: {reason}", kind="fail",
                   expect_from=[JobState.QUEUED], fields={"reason": reason})


def write_wait_reasons(store: Store, rows: Sequence[Job | QueueEntry], reasons: dict[int, str], placed: set[int]) -> None:
    changed = [
        (reasons.get(r.id), r.id) for r in rows
        if r.id not in placed and reasons.get(r.id) != r.wait_reason
    ]
    store_wait_reasons(store, changed)
