"""Ending attempts: classify, learn memory, decide retry, guard against crash loops."""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.attempts.classify import Classification, clip_reason, died_of_sigkill
from orchestrator.attempts.crash_loop import crash_loop_of, guard_crash_loop
from orchestrator.attempts.fused_lessons import group_shape_key, group_size, teaches_solo_speed
from orchestrator.attempts.kernel_log import kernel_oom_killed
from orchestrator.attempts.next_step import (
    CheckpointLeft,
    EndEvidence,
    NextStep,
    bounded_group_oom,
    classify_end,
    decide_next,
    fused_cap_after,
)
from orchestrator.attempts.printed_results import parse_result
from orchestrator.attempts.provenance_reads import read_provenance
from orchestrator.attempts.reconcile import group_is_ours, proven_group, read_log_tail, read_result
from orchestrator.attempts.reported import RunReading, reading_of
from orchestrator.attempts.run_evidence import LossVerdict, loss_verdict
from orchestrator.attempts.rundir_reads import IGNORED_FILES, read_gpu_peak_card, read_gpu_peak_mib
from orchestrator.attempts.share_record import read_share
from orchestrator.executors.base import cluster_owned
from orchestrator.executors.checkpoints import (
    checkpoint_step,
    remove_checkpoints,
    search_checkpoints,
)
from orchestrator.executors.observation import Observation
from orchestrator.executors.remote_verdict import ClusterEnd
from orchestrator.lifecycle import AttemptOutcome, JobState, KillRequest
from orchestrator.plans.resume import checkpoint_marker, resumable_attempts, worker_can_resume
from orchestrator.plans.template import OUR_WORKERS
from orchestrator.prediction.fused_groups import fused, shares_base
from orchestrator.prediction.job_facts import (
    JobShapeCache,
    attempt_shape_key,
    job_family_tag,
    job_keys,
    job_levels,
    job_prompt_length_key,
    job_shape_key,
)
from orchestrator.prediction.ladder import Level
from orchestrator.prediction.memory import update_shape
from orchestrator.prediction.shapes import shape_label
from orchestrator.prediction.throughput import interval_rate
from orchestrator.store.attempts import AttemptEnd, past_attempts, read_attempt, update_attempt
from orchestrator.store.db import Store
from orchestrator.store.endings import (
    PromptLesson,
    ShapeLesson,
    StopAskedMeanwhile,
    close_attempt,
    hung_attempts_before,
    neighbours,
)
from orchestrator.store.history import history_values
from orchestrator.store.learning import record_throughput
from orchestrator.store.queue import job_by_id
from orchestrator.store.rows import Attempt, Job
from orchestrator.store.sharing import group_ooms_before, lower_fused_cap, members_now
from orchestrator.wording import ended_on_gpu

log = logging.getLogger(__name__)

RESULT_TAIL_BYTES = 64 * 1024  # how much of the end of stdout.log is searched for printed metrics
_STOP_REREADS = 4  # stop requests are a user's: a handful at most lands while one end is decided


def ensure_group_dead(attempt: Attempt, obs: Observation | None) -> bool:
    """True once nothing of the attempt's process group lives; never waits, never signals (the
    daemon stops a group across passes, orchestrator.attempts.kills, before it ends the attempt).

    Never requeue before this is True: two live attempts of one job must not exist. Only a
    group orch can prove it started counts (reconcile.proven_group), never one named by a
    file in the run dir."""
    group = proven_group(attempt, obs)
    return group is None or not group_is_ours(*group)


def complete(
    store: Store,
    attempt: Attempt,
    obs: Observation | None,
    cache: JobShapeCache,
    *,
    lost: bool = False,
    hung: bool = False,
    disk_full_now: bool = False,
    remote_end: ClusterEnd | None = None,
    not_started: str | None = None,
) -> None:
    """Close a finished (or lost, or hung-and-killed) attempt and decide what its job does next.
    `disk_full_now`: the runs dir's filesystem is below its free-space minimum right now.
    `remote_end`: the cluster's own word on how it ended (Slurm's TIMEOUT, PREEMPTED, ...), which
    wins over the exit record the wrapper wrote when the cluster's signal stopped it.
    `not_started`: why its worker never started through no fault of its own (requeued uncounted).
    What the attempt teaches (memory, prompt length) is written with its end, in one transaction."""
    if not cluster_owned(attempt) and not ensure_group_dead(attempt, obs):
        log.warning("attempt %s: process group still alive; its end is recorded once it is gone", attempt.id)
        return
    for _ in range(_STOP_REREADS):  # a cancel or retry stored since the read wins: decide again
        found = _gather(store, attempt, obs, cache, lost=lost, hung=hung,
                        disk_full_now=disk_full_now, remote_end=remote_end, not_started=not_started)
        # pure, as is the decision (attempts.next_step); past its bound a group's OOM is stored as the job's own
        ended = bounded_group_oom(classify_end(found.evidence), found.group_ooms)
        step = decide_next(found.job, found.levels, found.level, ended,
                           hung_retries_so_far=found.hung_retries_so_far, ran_alone=found.ran_alone,
                           resumed_from=attempt.resumed_from_checkpoint, group_ooms_so_far=found.group_ooms,
                           trial_fence_mib=attempt.trial_fence_mib)
        with contextlib.suppress(StopAskedMeanwhile):
            closed = _write_end(store, attempt, found, ended.classification, step)
            break
        attempt = read_attempt(store, attempt.id) or attempt
    else:
        log.warning("attempt %s: stop requests keep arriving; its end is recorded next pass",
                    attempt.id)
        return
    if closed and step.job_state is JobState.SUCCEEDED:
        _remove_earlier_checkpoints(store, attempt)
    if ended.classification.outcome is AttemptOutcome.FAILED and not hung:
        guard_crash_loop(store, found.job.suite, found.job.config_name, crash_loop_of(found.job))
    if closed and ended.classification.outcome is AttemptOutcome.GROUP_OOM:
        members = ended.classification.group_members
        lower_fused_cap(store, found.job.suite, fused_cap_after(members),
                        f"a fused group of {members} members ran out of memory (job {found.job.id})")


@dataclass(frozen=True)
class _Gathered:
    """What `complete` reads before it decides: the run dir's files, the job and its ladder."""

    job: Job
    levels: list[Level]
    level: Level  # the attempt's
    evidence: EndEvidence
    problems: list[str]  # run-dir files refused as invalid
    peak_mib: int  # the most it held: orch's readings, its result's and the wrapper's own
    card: tuple[str, int] | None  # the card the wrapper saw it on (model, total MiB)
    hung_retries_so_far: int  # earlier attempts of the job killed as hung
    ran_alone: bool  # no other attempt on its card at its end (live or just ended)
    loss: LossVerdict | None = None  # a run that ended well: its loss summary and the divergence rule's word
    provenance: dict[str, str] | None = None  # the digest of its provenance records
    group_size: int = 1  # a fused member: the size of the group its peak belongs to (attempts.fused_lessons)
    group_ooms: int = 0  # earlier attempts of the job that ended as their fused group's OOM


def _gather(
    store: Store, attempt: Attempt, obs: Observation | None, cache: JobShapeCache, *, lost: bool, hung: bool,
    disk_full_now: bool, remote_end: ClusterEnd | None, not_started: str | None = None,
) -> _Gathered:
    run_dir = Path(attempt.run_dir)
    problems = list(obs.problems) if obs else []
    job = job_by_id(store, attempt.job_id)
    assert job is not None  # attempts reference their job (a foreign key)
    result = read_result(run_dir, problems)
    if result is not None and attempt.token and job.worker in OUR_WORKERS and result.get("token") != attempt.token:
        # our workers sign their result; this one was written by another attempt's worker
        problems.append("result.json: not written by this attempt's worker (no matching token); ignored")
        result = None
    levels = job_levels(job, cache)
    reported_peak = result.get("peak_mem_mib") if result else None
    peak_mib = max(attempt.peak_mib, int(reported_peak or 0) if isinstance(reported_peak, (int, float)) else 0,
                   read_gpu_peak_mib(run_dir))  # the wrapper's own reading, on the node it ran on
    exit_record = obs.exit_record if obs else None
    sigkilled = result is None and died_of_sigkill(
        (exit_record or {}).get("exit_code"), (exit_record or {}).get("signal")
    )
    ended_well = not (lost or hung) and (exit_record or {}).get("exit_code") == 0
    # the history was kept up to the attempt's end before it is completed (daemon.watcher)
    loss = loss_verdict(job, run_dir, result, history_values(store, attempt.id, "loss")) if ended_well else None
    evidence = EndEvidence(
        exit_record,
        result,
        read_log_tail(run_dir),
        attempt.kill_requested,
        lost=lost,
        hung=hung,
        disk_full_now=disk_full_now,
        remote_end=remote_end,
        not_started=not_started,
        kernel_oom_kill=sigkilled and _kernel_log_names(attempt, obs),
        checkpoint=_checkpoint_left(store, attempt, job) if sigkilled else None,
        diverged=loss.diverged if loss else None,
        fail_on_divergence=bool(loss and loss.fail),
        fused=fused(job),
    )
    return _Gathered(job, levels, levels[min(attempt.level, len(levels) - 1)], evidence, problems, peak_mib,
                     read_gpu_peak_card(run_dir),  # on a cluster, the only word on which card it ran
                     hung_attempts_before(store, attempt),
                     job.gpus == 1 and not cluster_owned(attempt) and not neighbours(store, attempt),
                     loss, read_provenance(run_dir, result, ended=True), _group_size(store, attempt, job, result),
                     group_ooms_before(store, attempt) if fused(job) else 0)


def _group_size(store: Store, attempt: Attempt, job: Job, result: dict[str, Any] | None) -> int:
    """A fused member's group size (attempts.fused_lessons); 1 for any other attempt. Its
    share.json is read once more (and kept) where observation had not seen it yet, so that the
    crash-loop guard and `orch show` know its process."""
    if not shares_base(job):
        return 1
    process, pid = attempt.share_process, attempt.share_pid
    if process is None and (record := read_share(attempt.run_dir)) is not None:
        update_attempt(store, attempt.id, **record.fields())
        process, pid = record.process, record.pid
    if not fused(job):
        return 1
    seen = members_now(store, process, pid, attempt.id) if process is not None and pid is not None else None
    return group_size(result, seen)


def _kernel_log_names(attempt: Attempt, obs: Observation | None) -> bool:
    """Whether the kernel log (where readable) names the attempt's wrapper or worker as
    OOM-killed since it started."""
    record = (obs.pid_record if obs else None) or {}
    pids = [p for p in (record.get("pid"), record.get("child_pid")) if isinstance(p, int)]
    return kernel_oom_killed(pids, attempt.started_at)


def _checkpoint_left(store: Store, attempt: Attempt, job: Job) -> CheckpointLeft | None:
    """The checkpoint the job's next attempt would resume from, this attempt's run dir included
    (plans.resume: only attempts a resume may cross); None where its worker cannot resume. It is
    progress when this attempt left it at a later step than the checkpoint it resumed from."""
    if not worker_can_resume(job.worker, job_keys(job), job.config):
        return None
    usable = resumable_attempts(past_attempts(store, job.id), job.worker, job.fresh_after_attempt)
    runs = ((n, Path(run_dir)) for n, run_dir in usable)
    found = search_checkpoints(runs, checkpoint_marker(job.worker)).checkpoint
    if found is None:
        return None
    resumed_step = checkpoint_step(attempt.resumed_from_checkpoint)
    further = resumed_step is None or found.step > resumed_step
    progress = found.attempt_n == attempt.n and further
    return CheckpointLeft(found.attempt_n, str(found.path), progress=progress)


def _write_end(store: Store, attempt: Attempt, found: _Gathered, verdict: Classification, step: NextStep) -> bool:
    """The attempt's end, what it teaches (memory, prompt length) and its job's next state, in
    one transaction. True if this call closed it."""
    job, level, peak_mib = found.job, found.level, found.peak_mib
    result, exit_record = found.evidence.result, found.evidence.exit_record
    needed_mib = verdict.oom_detail.needed_mib() if verdict.oom_detail is not None else None
    held_at_death_mib = max(attempt.held_mib, peak_mib, int(needed_mib or 0))
    data: dict[str, Any] = {"gpu": attempt.gpu_index, "peak_mib": peak_mib, "held_mib": attempt.held_mib}
    if found.card is not None:
        data["gpu_model"], data["gpu_total_mib"] = found.card
    if verdict.outcome in (AttemptOutcome.OOM, AttemptOutcome.HOST_OOM):
        data["neighbours"] = neighbours(store, attempt)
        if verdict.oom_detail is not None:
            data["oom_detail"] = {k: v for k, v in vars(verdict.oom_detail).items() if v is not None}
    if step.retry is not None:
        data["retry"] = step.retry
    if verdict.outcome is AttemptOutcome.SUCCEEDED:
        message = f"attempt {attempt.n} succeeded, peak {peak_mib / 1024:.1f} GiB"
        if found.loss is not None and found.loss.diverged:
            message += f"; loss diverged: {found.loss.diverged} (marked in results)"
    else:
        message = ended_on_gpu(attempt.n, verdict.outcome.value, attempt.gpu_index, verdict.reason, step.why)
    reason = verdict.reason
    if found.problems:  # what in the run dir was refused: named, never the cause of a crash
        unique = list(dict.fromkeys(found.problems))
        reason = f"{reason}; {IGNORED_FILES}{'; '.join(unique)}"[:1000]
        message = f"{message}; {IGNORED_FILES}{'; '.join(unique)}"[:1000]
        data["invalid_files"] = unique[:20]
    succeeded_silently = result is None and verdict.outcome is AttemptOutcome.SUCCEEDED
    printed = _stdout_metrics(job, Path(attempt.run_dir)) if succeeded_silently else None
    return close_attempt(
        store, attempt,
        AttemptEnd(
            outcome=verdict.outcome.value, reason=reason,
            exit_code=(exit_record or {}).get("exit_code"), signal=(exit_record or {}).get("signal"),
            peak_mib=peak_mib, job_state=step.job_state, job_fields=step.job_fields, message=message, data=data,
            output_metrics=printed, reported=reading_of(result, printed).to_record(),
            loss=found.loss.summary.to_record() if found.loss and found.loss.summary else None,
            diverged=found.loss.diverged if found.loss else None, provenance=found.provenance,
        ),
        # a start on trial was placed into its fence's room, not at its prediction
        shape=_shape_lesson(job, level, verdict.outcome, peak_mib, held_at_death_mib,
                            attempt.trial_fence_mib or attempt.predicted_peak_mib, found.group_size),
        prompt=_prompt_lesson(job, verdict.outcome, result), kill_seen=True,
    )


def _remove_earlier_checkpoints(store: Store, attempt: Attempt) -> None:
    """A succeeded job resumes no more: the checkpoints its earlier attempts left are deleted
    (its own, the worker's to keep or remove)."""
    earlier = [Path(past.run_dir) for past in past_attempts(store, attempt.job_id) if past.n < attempt.n]
    removed = remove_checkpoints(earlier)
    if removed:
        log.info("job %s succeeded: removed %d checkpoint(s) of its earlier attempts", attempt.job_id, len(removed))


def _stdout_metrics(job: Job, run_dir: Path) -> dict[str, float] | None:
    """A script that wrote no result.json: the metrics it printed last (the suite's
    `result_regex`, else the last JSON object line), from the tail of its stdout.log."""
    regex = job.worker_output.get("result_regex")
    try:
        return parse_result(read_log_tail(run_dir, RESULT_TAIL_BYTES), regex if isinstance(regex, str) else None)
    except re.error:  # checked at submit; a row edited since must not stop the attempt's end
        return None


def _shape_lesson(
    job: Job, level: Level, outcome: AttemptOutcome, peak_mib: int, held_at_death_mib: int, placed_mib: int | None,
    members: int = 1,
) -> ShapeLesson | None:
    """How the attempt folds into its shape's memory record. For an OOM, what the process held
    plus what it asked for when it died (torch's message) is a floor on what the shape needs.
    A fused member that trained in a group of `members` >= 2 teaches its shape's record at that
    group size instead (attempts.fused_lessons)."""
    if outcome not in (AttemptOutcome.SUCCEEDED, AttemptOutcome.OOM):
        return None
    label = shape_label(job.config_name, level.index, job.data)
    return ShapeLesson(
        group_shape_key(job_shape_key(job, level), members),
        lambda old: update_shape(old, peak_mib or None, outcome, held_at_death_mib or None, placed_mib or None),
        job.suite, label if members <= 1 else f"{label}, fused ×{members}",
        # a group's peak is no point of its shape's memory family (it would skew the fit)
        job_family_tag(job, level) if members <= 1 else None,
    )


def learn_rate(
    store: Store, attempt: Attempt, job: Job, before: tuple[int, float], after: tuple[int, float],
    tenants: int, cache: JobShapeCache,
) -> None:
    """Record the attempt's samples/s between two progress readings (steps × effective batch
    over the time between them) at `tenants` attempts on its card; none for a fused member (its
    rate is its group's step shared out: attempts.fused_lessons)."""
    if not teaches_solo_speed(attempt.share_mode, fused(job)):
        return
    config = {**job.config, **attempt.overrides}
    per_step = 1
    for key in ("batch_size", "gradient_accumulation_steps"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            per_step *= value
    rate = interval_rate(before[0], before[1], after[0], after[1], per_step)
    if rate is None:
        return
    key = attempt_shape_key(job, attempt, cache)
    record_throughput(store, attempt.gpu_uuid, key, tenants, rate, job.suite, steps=after[0] - before[0])


def _prompt_lesson(job: Job, outcome: AttemptOutcome, result: dict[str, Any] | None) -> PromptLesson | None:
    """A finished LoRA run reports its longest prompt; estimates of the model and data use it."""
    tokens = (result or {}).get("longest_tokens")
    if outcome is AttemptOutcome.SUCCEEDED and isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
        return PromptLesson(job_prompt_length_key(job), tokens)
    return None


def fail_before_start(
    store: Store, attempt: Attempt, reason: str, *, disk_full: bool = False, not_counted: bool = False,
) -> None:
    """The run dir or launcher failed before the worker existed: the attempt fails with that
    reason; the job is requeued while attempts remain (the daemon itself keeps running). A full
    disk is not the job's fault, nor a cluster too busy to take it (`not_counted`): requeued
    without counting the attempt. A cancel asked meanwhile wins: the job is cancelled."""
    disk_full_or_busy = disk_full or not_counted
    job = job_by_id(store, attempt.job_id)
    assert job is not None  # attempts reference their job (a foreign key)
    for _ in range(_STOP_REREADS):
        attempt = read_attempt(store, attempt.id) or attempt
        cancelled = attempt.kill_requested is KillRequest.CANCEL
        requeue = not cancelled and (disk_full_or_busy or job.counted_attempts < job.max_attempts)
        fields: dict[str, Any] = {"reason": None if requeue else clip_reason(reason)}
        if cancelled:
            fields["reason"] = "cancelled by user"
        elif disk_full_or_busy:
            fields["max_attempts"] = job.max_attempts + 1
        next_state = JobState.QUEUED if requeue else JobState.FAILED
        outcome = AttemptOutcome.LOST if disk_full_or_busy else AttemptOutcome.FAILED
        said = f"attempt {attempt.n} failed to start: {reason}" + ("; requeued" if requeue else "")
        with contextlib.suppress(StopAskedMeanwhile):
            close_attempt(store, attempt, AttemptEnd(
                outcome=outcome.value, reason=clip_reason(reason), exit_code=None, signal=None,
                peak_mib=0, job_state=JobState.CANCELLED if cancelled else next_state,
                job_fields=fields, message=said, data={"run_dir": attempt.run_dir},
                reported=RunReading(None).to_record(),  # it reported nothing
            ), kill_seen=True)
            break
    # A launch failure (a bad template, a command that cannot start) fails every attempt the same
    # way within a second: the crash-loop guard counts it like any other fast failure. A full
    # disk is the machine's, a busy controller the cluster's, not the suite's: they pause nothing.
    if not (disk_full or not_counted):
        guard_crash_loop(store, job.suite, job.config_name, crash_loop_of(job))


def abandon(store: Store, attempt: Attempt, reason: str, obs: Observation | None = None) -> bool:
    """Close an attempt orch keeps failing to check, once nothing of its proven group lives: it
    fails with that reason and its job is requeued while attempts remain. True once closed."""
    if not ensure_group_dead(attempt, obs):
        return False
    fail_before_start(store, attempt, reason)
    return True
