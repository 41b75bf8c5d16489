"""One scheduling pass: queued jobs and live attempts from the store + GPU snapshots -> `pack`
-> attempts started. The policy itself is the pure `orchestrator.scheduling.packing.pack.pack`."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any

from orchestrator.errors import InvalidTransition, OrchError
from orchestrator.executors.base import Executor
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.lifecycle import JobState
from orchestrator.plans import DEFAULT_SLOTS, GpuPlan
from orchestrator.prediction.durations import CompletedRun, DurationTable
from orchestrator.prediction.fused_groups import fuse_group, fuse_max
from orchestrator.prediction.job_facts import (
    JobFacts,
    as_received,
    attempt_config,
    attempt_shape_key,
    job_prompt_length_key,
    level_of,
    shape_facts,
)
from orchestrator.prediction.learned import (
    Knowledge,
    held_peaks,
    running_peaks,
    throughput_curves,
    unproven_trials,
)
from orchestrator.prediction.startup import Startup, expected_end_s, remaining_s, startup_key
from orchestrator.prediction.throughput import family_curves
from orchestrator.scheduling.family_inputs import family_tags, mark_probes
from orchestrator.scheduling.launching import DispatchContext, claim, launch_all
from orchestrator.scheduling.pack_inputs import (
    ClaimPlan,
    PassReadings,
    claim_plans,
    host_running_peaks,
    pack_inputs,
    with_group_peaks,
    with_teaching,
)
from orchestrator.scheduling.packing.pack import PackingDecision, can_take_any, open_slots, pack
from orchestrator.scheduling.packing.types import GpuState
from orchestrator.scheduling.queue_index import QueueRead
from orchestrator.scheduling.queue_kinds import handed_to_pack
from orchestrator.scheduling.resources import host_state, running_attempts
from orchestrator.scheduling.start_levels import LevelMove, start_moves
from orchestrator.scheduling.state import SchedulerState
from orchestrator.scheduling.teaching import teaching_jobs
from orchestrator.scheduling.waits import changed_wait_reasons, rows_to_explain
from orchestrator.store.attempts import (
    read_all_prompt_lengths,
    read_all_shapes,
)
from orchestrator.store.db import Store
from orchestrator.store.jobs import get_gpu_plan, move_queued_to_level, transition
from orchestrator.store.learning import read_throughput
from orchestrator.store.queue import (
    jobs_by_id,
    live_attempts_with_jobs,
    queued_jobs,
    queued_jobs_alike,
    queued_with_bad_priority,
    succeeded_runs_since,
)
from orchestrator.store.queue import write_wait_reasons as store_wait_reasons
from orchestrator.store.resources import read_host_shapes
from orchestrator.store.rows import Attempt, Job, QueueEntry
from orchestrator.store.sharing import fused_caps
from orchestrator.store.startups import read_startups
from orchestrator.store.status import paused_configs, paused_suites

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


def gpu_states(snapshots: tuple[GpuSnapshot, ...], plan: GpuPlan, fenced: Container[str] = ()) -> list[GpuState]:
    """`fenced`: the UUIDs of the cards whose workers orch's MPS control daemon fences."""
    return [
        GpuState(
            index=s.index, uuid=s.uuid, total_mib=s.total_mib, free_mib=s.free_mib,
            slots=plan.slots_for(s.index, DEFAULT_SLOTS), fenced=s.uuid in fenced,
        )
        for s in snapshots
    ]


def schedule(
    store: Store,
    snapshots: tuple[GpuSnapshot, ...],
    executor: Executor,
    ctx: DispatchContext,
    state: SchedulerState,
    *,
    draining: bool,
    hold: str | None = None,
    run_age_s: Callable[[Attempt], float | None] | None = None,
) -> PackingDecision:
    """Pack the queue onto the GPUs and start what fits. Returns the decision (for tests).

    Named steps: read the queue -> per-kind inputs -> pack -> claim and launch -> wait reasons.
    The deciding ones take values (orchestrator.scheduling.pack_inputs, `pack`,
    orchestrator.scheduling.waits); the rest read and write.
    When no card has a free slot with free memory, only the head of the queue is read (for its
    waiting reasons): a long queue then costs nothing while it waits. `hold`: why nothing may
    start now (a full disk); every queued job shows it. `run_age_s`: how long a live attempt has
    run, as the daemon measured it on its monotonic clock; without it, from its wall-clock start."""
    cache = state.shapes
    _fail_bad_priorities(store)
    paused = {p.suite: p.reason for p in paused_suites(store, count_queued=False)}
    paused_cfgs = frozenset((p.suite, p.config) for p in paused_configs(store, count_queued=False))
    live, live_jobs = live_attempts_with_jobs(store)
    durations = refresh_durations(store, state)
    # one RunningAttempt per card of a multi-GPU attempt, each with its expected end
    startups = read_startups(store) if ctx.policy.overlap else {}
    caps = fused_caps(store)
    running = running_attempts(live, {s.uuid: s.index for s in snapshots},
                               _expected_end(live_jobs, durations, startups, store.now_s(), run_age_s),
                               _fused_of(live_jobs, caps))
    plan = get_gpu_plan(store)
    gpus = gpu_states(snapshots, plan, ctx.mps.cards if ctx.mps is not None else ())
    whole_queue = not draining and can_take_any(gpus, running, ctx.policy)
    fresh_key = (
        tuple(a.id for a in live),
        plan,
        tuple(sorted(paused.items())),
        tuple(sorted(paused_cfgs)),
        draining,
        hold,
    )
    per_kind = max(1, open_slots(gpus, running, ctx.policy)) if whole_queue else 0
    rows = _read_queue(store, state, ctx, whole_queue, per_kind, fresh_key)
    if rows is None:  # nothing can start and the head's reasons still stand
        return PackingDecision((), {})
    readings = _read_learned(store, state, live, live_jobs, snapshots, durations, startups, caps,
                             fenced=any(g.fenced for g in gpus))
    running = mark_probes(running, live, live_jobs, readings.knowledge, cache)
    running = with_group_peaks(running, live, live_jobs, readings.shapes, cache, snapshots)
    facts_of = state.job_facts.by_job
    moves = start_moves(rows, facts_of, readings, cache, gpus, ctx.policy)
    if moves:  # they are read again, at their new level, in the next pass
        moved = _apply_moves(store, moves)
        rows = [row for row in rows if row.id not in moved]
    now_s = store.now_s()
    waiting_since_s = state.queue.waits.waiting_since_s(rows, now_s, store.clock.monotonic_s())
    inputs = pack_inputs(rows, facts_of, readings, cache, state.kinds.lists if whole_queue else None,
                         waiting_since_s)
    queue = with_teaching(inputs.queue, _teaching(inputs.firsts, live_jobs))
    host = None
    if ctx.host is not None:
        cpus_of_job = {j.id: j.cpus for j in live_jobs.values()}
        host = host_state(ctx.host.snapshot(), ctx.host_reserve_mib, live, cpus_of_job,
                          any(q.cpus is not None for q in queue))
    decision = pack(queue, gpus, running, ctx.policy, now_s, host=host, topology=ctx.topology,
                    paused=paused, paused_configs=paused_cfgs, draining=draining, hold=hold)
    _claim_and_launch(store, executor, ctx, claim_plans(decision, inputs, facts_of, snapshots), caps)
    _explain_waits(store, state, rows, {q.job_id for q in queue}, decision, whole_queue)
    return decision


def _read_queue(store: Store, state: SchedulerState, ctx: DispatchContext, whole_queue: bool, per_kind: int,
                fresh_key: tuple[Any, ...]) -> list[QueueEntry] | None:
    """The queued jobs handed to `pack`, their facts learned (a job whose ladder is invalid
    fails here). Over the whole queue: the head (whose waiting reasons `pack` gives) and each
    kind's first `per_kind` (jobs of one kind differ only by their place in the queue, and no
    pass places more jobs than there are free slots). Otherwise the head alone, or None while
    its waiting reasons still stand."""
    if not whole_queue:
        head = state.queue.head(store, ctx.policy.reasons_for)
        if head is None:
            head = queued_jobs(store, limit=ctx.policy.reasons_for)
        if _reasons_still_fresh(state, fresh_key, head, store.clock.monotonic_s()):
            return None
        _learn_new_jobs(store, head, state)
        return head
    state.queue.read(store)
    read = state.queue.take_changes()
    _forget_left(state, read)
    entries = state.queue.entries
    if read.whole:
        _learn_new_jobs(store, state.queue.order, state)
        state.kinds.rebuild(state.queue.order, state.job_facts.by_job)
    else:
        _learn_new_jobs(store, [entries[i] for i in read.changed if i in entries], state)
        state.kinds.add(read.changed, entries, state.job_facts.by_job)
    return handed_to_pack(state.queue.first(ctx.policy.reasons_for + per_kind), state.kinds.heads(per_kind, entries))


def _read_learned(store: Store, state: SchedulerState, live: list[Attempt], live_jobs: Mapping[int, Job],
                  snapshots: tuple[GpuSnapshot, ...], durations: DurationTable,
                  startups: Mapping[str, Startup], caps: Mapping[str, int], *, fenced: bool = False) -> PassReadings:
    """What orch has learned that the queued jobs' inputs rest on: measured shapes and prompt
    lengths, live attempts' peaks, memory families, co-location curves, host memory."""
    cache = state.shapes

    def key_of(job: Job, attempt: Attempt) -> str:
        return attempt_shape_key(job, attempt, cache)

    shapes = read_all_shapes(store)
    knowledge = Knowledge(shapes, running_peaks(live, live_jobs, key_of), held_peaks(live, live_jobs, key_of),
                          family_tags(store, live, live_jobs, cache))
    curves = throughput_curves(read_throughput(store), {s.uuid: s.index for s in snapshots})
    by_family = family_curves(curves, {key: tag.family_key for key, tag in knowledge.tags.items()})
    return PassReadings(shapes, read_all_prompt_lengths(store), knowledge, durations, curves, by_family,
                        read_host_shapes(store), host_running_peaks(live, live_jobs, key_of),
                        startups, caps, fenced,
                        frozenset(unproven_trials(live, live_jobs, key_of)) if fenced else frozenset())


def _apply_moves(store: Store, moves: list[LevelMove]) -> set[int]:
    """Write the start-where-it-fits moves: jobs to their level, or failed with the reason."""
    moved: set[int] = set()
    for move in moves:
        if move.level is not None:
            moved.update(move_queued_to_level(store, move.job_ids, move.level, move.note))
            continue
        for job in jobs_by_id(store, move.job_ids).values():
            fail_queued(store, job, move.note)
            moved.add(job.id)
    return moved


def _fused_of(live_jobs: Mapping[int, Job], caps: Mapping[str, int]) -> Callable[[Attempt], tuple[str | None, int]]:
    """A live attempt's fused group (at the overrides it runs with) and that group's cap now."""
    def of(a: Attempt) -> tuple[str | None, int]:
        job = live_jobs.get(a.job_id)
        group = None if job is None else fuse_group(job, job.suite, a.overrides, a.run_alone)
        return (group, fuse_max(job, caps.get(job.suite))) if group is not None and job is not None else (None, 1)
    return of


def _teaching(firsts: list[tuple[int, str | None, int]], live_jobs: Mapping[int, Job]) -> set[int]:
    """The jobs that start early to teach a prediction (orchestrator.scheduling.teaching)."""
    if not any(group is not None for _, group, _ in firsts):
        return set()
    return teaching_jobs(firsts, {job_prompt_length_key(j) for j in live_jobs.values() if j.worker == "lora"})


def _claim_and_launch(store: Store, executor: Executor, ctx: DispatchContext, plans: list[ClaimPlan],
                      caps: Mapping[str, int] | None = None) -> None:
    """Write each placed attempt as started, then start their workers. A job placed at a later
    level than its own (it ends sooner there) moves to it first, with the note saying why."""
    moved = {
        p.job_id
        for p in plans
        if p.level_note and move_queued_to_level(store, [p.job_id], p.level.index, p.level_note)
    }
    plans = [p for p in plans if not p.level_note or p.job_id in moved]  # a job that left the queue stays out
    placed = jobs_by_id(store, [p.job_id for p in plans])
    caps = fused_caps(store) if caps is None else caps  # each suite's lowered fused cap (ORCH_FUSE_MAX)
    claims = []
    opened: dict[int, int] = {}  # job id -> its attempt, where it opened a fused process this pass
    for p in plans:
        whole = placed[p.job_id]
        process = p.process
        opens = process is not None and process.opens
        joins = None if process is None or opens else (
            process.process if process.with_job is None else opened.get(process.with_job))
        # the attempt records its changes as the script receives them (the suite's `keys:`)
        claimed = claim(store, ctx, whole, as_received(whole, p.level), attempt_config(whole, p.level), p.gpu,
                        p.predicted_mib, p.source, p.reserved_mib, p.cards, p.host_mib, caps.get(whole.suite),
                        ahead=p.ahead, fuse_process=joins, opens_process=opens, trial_fence_mib=p.trial_fence_mib)
        if claimed is not None:
            claims.append(claimed)
            if opens:
                opened[p.job_id] = claimed.attempt.id
    launch_all(store, executor, ctx, claims)


def _explain_waits(store: Store, state: SchedulerState, rows: list[QueueEntry], handed: set[int],
                   decision: PackingDecision, whole_queue: bool) -> None:
    """Write the waiting reasons that changed: of the jobs handed to `pack` and, after a pass
    over the whole queue, of any other whose old reason no longer stands."""
    reasons = decision.wait_reasons
    reason_left = [state.queue.entries[i] for i in state.queue.with_reason - handed] if whole_queue else []
    write_wait_reasons(store, rows_to_explain(rows, reasons, whole_queue=whole_queue, reason_left=reason_left),
                       reasons, {p.job_id for p in decision.placements})


WAITING_REFRESH_S = 5.0  # while nothing can start, the head's waiting reasons are this old at most


def _reasons_still_fresh(state: SchedulerState, key: tuple[Any, ...], head: list[QueueEntry],
                         monotonic_s: float) -> bool:
    """While no card can take anything, the head's waiting reasons are worked out again only
    when what they rest on changed (`key`: the running attempts, the plan, pauses, draining, a
    hold; or the head's rows) or WAITING_REFRESH_S has passed: free memory in them may be that
    old. Nothing could start either way, so a pass skipped here places nothing. Timed on the
    monotonic clock: a wall step back would keep stale reasons for as long as the step."""
    last = state.waiting_checked
    rows = tuple(head)
    if last is not None and last[0] == key and last[1] == rows and monotonic_s - last[2] < WAITING_REFRESH_S:
        return True
    state.waiting_checked = (key, rows, monotonic_s)
    return False


def _forget_left(state: SchedulerState, read: QueueRead) -> None:
    """Drop the facts of jobs that left the queue, and shapes no queued job has."""
    facts = state.job_facts
    if read.whole:
        facts.keep_only(state.queue.entries)
    else:
        facts.forget(read.left)
    if len(state.shapes.shapes) + len(facts.pool) > 2 * len(facts.by_job) + 100:
        facts.trim_pool()
        state.shapes.keep_shapes(f.shape for f in facts.pool.values())


def _expected_end(
    live_jobs: Mapping[int, Job], durations: DurationTable, startups: Mapping[str, Startup], now_s: float,
    run_age_s: Callable[[Attempt], float | None] | None = None,
) -> Callable[[Attempt], float | None]:
    """When a live attempt is expected to end, on the scale of `now_s`: by its progress (steps to
    go at its pace since its learned start-up, with `expected_end_s`'s margin and exit, or its
    start plus the learned run time of its kind where that is later) where it reports a step and
    a total and start-ups are read (overlap on); else its start plus the learned run time of its kind. Its start is
    `now_s` less how long it has run (`run_age_s`, monotonic), so that a wall-clock step moves
    its end with `now_s`; the recorded wall-clock start only where no such measure is given."""
    def end(a: Attempt) -> float | None:
        job = live_jobs.get(a.job_id)
        if job is None:
            return None
        age_s = None if run_age_s is None else run_age_s(a)
        if run_age_s is not None and age_s is None:
            return None  # how long it has run is not known: neither is its end
        started_s = a.started_at if age_s is None else now_s - age_s
        expected = durations.expected_s(job.config_name, job.data, a.level)
        by_kind = None if expected is None else started_s + expected
        if startups:
            startup = startups.get(startup_key(job.suite, job.config_name))
            first = _first_step(a, now_s, now_s - started_s)
            left = remaining_s(now_s, started_s, startup.seconds if startup else None,
                               (a.progress or {}).get("step"), (a.progress or {}).get("total"), first)
            if left is not None:
                by_progress = expected_end_s(now_s, left)
                # the later of the two: just past its start-up an attempt's pace rests on a
                # second or two of steps (on an H200 a TRL job's end read at least 6 s early from it)
                return by_progress if by_kind is None else max(by_progress, by_kind)
        return by_kind
    return end


def _first_step(attempt: Attempt, now_s: float, age_s: float) -> tuple[int, float] | None:
    """The attempt's first step seen and the seconds since, on the clock of its record (`now_s`
    less when it was seen); None where it is not known, or where that is not within how long the
    attempt has run (`age_s`): a wall clock that stepped since."""
    if attempt.first_step is None or attempt.first_step_at is None:
        return None
    since_s = now_s - attempt.first_step_at
    return (attempt.first_step, since_s) if 0 < since_s <= age_s + 1.0 else None


def _declared_host_mib(job: Job) -> int | None:
    """The config's `host_mem_gib` (RAM of the whole process tree), when it gives a number."""
    value = job.config.get("host_mem_gib")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 65536:
        return None
    return round(value * 1024)


def _learn_new_jobs(store: Store, rows: list[QueueEntry], state: SchedulerState) -> None:
    """Level and shape facts for jobs not seen before, or whose level or host steps changed;
    a job whose ladder cannot be expanded fails here."""
    cache, known = state.shapes, state.job_facts
    stale = [r.id for r in rows if (f := known.by_job.get(r.id)) is None or f.key != (r.level, r.host_steps_json)]
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
            known.forget(alike)
            for failed in jobs_by_id(store, alike).values():
                fail_queued(store, failed, f"invalid ladder: {exc}")
            continue
        facts = JobFacts(
            key=(job.level, job.host_steps_json), level=level, shape=shape_facts(job, level, cache),
            allowed=job.allowed_gpus, gpus=job.gpus, cpus=job.cpus, declared_host_mib=_declared_host_mib(job),
            min_stack_gain=job.min_stack_gain,
        )
        facts = known.share(facts)
        for job_id in alike:
            known.by_job[job_id] = facts


def _fail_bad_priorities(store: Store) -> None:
    """A queued job whose stored priority is not a whole number fails, alone: the queue's order
    cannot place it, and every other job must still start."""
    for job_id, priority in queued_with_bad_priority(store):
        reason = (f"its priority {str(priority)[:40]!r} is not a whole number: "
                  "submit it again with one")
        with contextlib.suppress(InvalidTransition):
            transition(store, job_id, JobState.FAILED, message=f"failed: {reason}", kind="fail",
                       expect_from=[JobState.QUEUED], fields={"reason": reason, "priority": 0})


def fail_queued(store: Store, job: Job, reason: str) -> None:
    with contextlib.suppress(InvalidTransition):
        transition(store, job.id, JobState.FAILED, message=f"failed: {reason}", kind="fail",
                   expect_from=[JobState.QUEUED], fields={"reason": reason})


def write_wait_reasons(
    store: Store, rows: Sequence[Job | QueueEntry], reasons: dict[int, str], placed: set[int]
) -> None:
    store_wait_reasons(store, changed_wait_reasons(rows, reasons, placed))
