"""Ending attempts: classify, learn memory, decide retry, guard against crash loops."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.attempts.classify import Classification, clip_reason, died_of_sigkill
from orchestrator.attempts.kernel_log import kernel_oom_killed
from orchestrator.attempts.next_step import (
    CheckpointLeft,
    EndEvidence,
    NextStep,
    classify_end,
    decide_next,
)
from orchestrator.attempts.printed_metrics import parse_result
from orchestrator.attempts.provenance_reads import read_provenance
from orchestrator.attempts.reconcile import group_is_ours, proven_group, read_log_tail, read_result
from orchestrator.attempts.reported import RunReading, reading_of
from orchestrator.attempts.run_evidence import LossVerdict, loss_verdict
from orchestrator.attempts.rundir_reads import read_gpu_peak_card, read_gpu_peak_mib
from orchestrator.executors.base import cluster_owned
from orchestrator.executors.checkpoints import remove_checkpoints, search_checkpoints
from orchestrator.executors.observation import Observation
from orchestrator.executors.remote_verdict import ClusterEnd
from orchestrator.lifecycle import AttemptOutcome, JobState
from orchestrator.plans import CrashLoop
from orchestrator.plans.resume import resumable_attempts, worker_can_resume
from orchestrator.plans.template import OUR_WORKERS
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
from orchestrator.store.attempts import AttemptEnd, past_attempts
from orchestrator.store.db import Store
from orchestrator.store.endings import (
    PromptLesson,
    ShapeLesson,
    close_attempt,
    hung_attempts_before,
    neighbours,
    pause_config,
    pause_suite,
    recent_failure_durations,
    unpaused_configs,
)
from orchestrator.store.learning import record_throughput
from orchestrator.store.queue import job_by_id
from orchestrator.store.rows import Attempt, Job
from orchestrator.store.status import paused_configs
from orchestrator.wording import ended_on_gpu

log = logging.getLogger(__name__)

RESULT_TAIL_BYTES = 64 * 1024  # how much of the end of stdout.log is searched for printed metrics


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
    found = _gather(store, attempt, obs, cache, lost=lost, hung=hung, disk_full_now=disk_full_now,
                    remote_end=remote_end, not_started=not_started)
    ended = classify_end(found.evidence)  # pure, as is the decision (orchestrator.attempts.next_step)
    step = decide_next(found.job, found.levels, found.level, ended, hung_retries_so_far=found.hung_retries_so_far,
                       ran_alone=found.ran_alone)
    closed = _write_end(store, attempt, found, ended.classification, step)
    if closed and step.job_state is JobState.SUCCEEDED:
        _remove_earlier_checkpoints(store, attempt)
    if ended.classification.outcome is AttemptOutcome.FAILED and not hung:
        guard_crash_loop(store, found.job.suite, found.job.config_name, crash_loop_of(found.job))


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
    sigkilled = result is None and died_of_sigkill((exit_record or {}).get("exit_code"), (exit_record or {}).get("signal"))
    ended_well = not (lost or hung) and (exit_record or {}).get("exit_code") == 0
    loss = loss_verdict(job, run_dir, result) if ended_well else None
    evidence = EndEvidence(exit_record, result, read_log_tail(run_dir), attempt.kill_requested,
                           lost=lost, hung=hung, disk_full_now=disk_full_now, remote_end=remote_end, not_started=not_started,
                           kernel_oom_kill=sigkilled and _kernel_log_names(attempt, obs),
                           checkpoint=_checkpoint_left(store, attempt, job) if sigkilled else None,
                           diverged=loss.diverged if loss else None, fail_on_divergence=bool(loss and loss.fail))
    return _Gathered(job, levels, levels[min(attempt.level, len(levels) - 1)], evidence, problems, peak_mib,
                     read_gpu_peak_card(run_dir),  # on a cluster, the only word on which card it ran
                     hung_attempts_before(store, attempt),
                     job.gpus == 1 and not cluster_owned(attempt) and not neighbours(store, attempt),
                     loss, read_provenance(run_dir, result))


def _kernel_log_names(attempt: Attempt, obs: Observation | None) -> bool:
    """Whether the kernel log (where readable) names the attempt's wrapper or worker as
    OOM-killed since it started."""
    record = (obs.pid_record if obs else None) or {}
    pids = [p for p in (record.get("pid"), record.get("child_pid")) if isinstance(p, int)]
    return kernel_oom_killed(pids, attempt.started_at)


def _checkpoint_left(store: Store, attempt: Attempt, job: Job) -> CheckpointLeft | None:
    """The checkpoint the job's next attempt would resume from, this attempt's run dir included
    (plans.resume: only attempts a resume may cross); None where its worker cannot resume."""
    if not worker_can_resume(job.worker, job_keys(job), job.config):
        return None
    usable = resumable_attempts(past_attempts(store, job.id), job.worker, job.fresh_after_attempt)
    found = search_checkpoints((n, Path(run_dir)) for n, run_dir in usable).checkpoint
    if found is None:
        return None
    return CheckpointLeft(found.attempt_n, str(found.path), own=found.attempt_n == attempt.n)


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
        reason = f"{reason}; ignored invalid run-dir files: {'; '.join(unique)}"[:1000]
        message = f"{message}; ignored invalid run-dir files: {'; '.join(unique)}"[:1000]
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
        shape=_shape_lesson(job, level, verdict.outcome, peak_mib, held_at_death_mib, attempt.predicted_peak_mib),
        prompt=_prompt_lesson(job, verdict.outcome, result),
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
    job: Job, level: Level, outcome: AttemptOutcome, peak_mib: int, held_at_death_mib: int, placed_mib: int | None
) -> ShapeLesson | None:
    """How the attempt folds into its shape's memory record. For an OOM, what the process held
    plus what it asked for when it died (torch's message) is a floor on what the shape needs."""
    if outcome not in (AttemptOutcome.SUCCEEDED, AttemptOutcome.OOM):
        return None
    return ShapeLesson(
        job_shape_key(job, level),
        lambda old: update_shape(old, peak_mib or None, outcome, held_at_death_mib or None, placed_mib or None),
        job.suite, shape_label(job.config_name, level.index, job.data), job_family_tag(job, level),
    )


def learn_rate(
    store: Store, attempt: Attempt, job: Job, before: tuple[int, float], after: tuple[int, float],
    tenants: int, cache: JobShapeCache,
) -> None:
    """Record the attempt's samples/s between two progress readings (steps × effective batch
    over the time between them) at `tenants` attempts on its card."""
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


def crash_loop_of(job: Job) -> CrashLoop:
    """The suite's crash-loop setting as it was when this job was submitted."""
    return CrashLoop(
        failures=job.crash_loop_failures,
        within_s=job.crash_loop_within_s,
        window_s=job.crash_loop_window_s,
    )


def _seconds(seconds: float) -> str:
    """300 -> '5 min', 90 -> '90 s': the guard's settings as a user wrote them, roughly."""
    if seconds >= 120 and seconds % 60 == 0:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:g} s"


def crash_loop_reason(durations_s: list[float], guard: CrashLoop) -> str | None:
    """Why the suite should pause, given how long each of its recent non-OOM failures ran
    (those that ended inside the guard's window); None while it should not."""
    if not guard.enabled:
        return None
    # a negative length is a wall-clock step back while it ran (its length is unknown), not a crash
    fast = [d for d in durations_s if 0 <= d < guard.within_s]
    if len(fast) < guard.failures:
        return None
    attempts = "attempt" if len(fast) == 1 else "attempts"
    return f"{len(fast)} {attempts} failed within {_seconds(guard.within_s)} each in the last {_seconds(guard.window_s)}"


def guard_crash_loop(store: Store, suite: str, config: str, guard: CrashLoop) -> None:
    """Pause a config whose attempts keep failing within seconds for non-OOM reasons; the
    suite's other configs run on, and the suite itself pauses once every config of it is
    paused. The failing job's setting decides, so a suite resubmitted with a changed
    `crash_loop` uses the new one."""
    if not guard.enabled:
        return
    now_s = store.now_s()
    durations = recent_failure_durations(store, suite, config, now_s - guard.window_s, now_s)
    reason = crash_loop_reason(durations, guard)
    if reason is None:
        return
    fix = (f"fix it, then `orch retry --suite {suite}` (and `orch resume {suite}`, unless the fix changed its worker "
           "command)")
    still_running = unpaused_configs(store, suite)
    others = [name for name in still_running if name != config]
    if others:
        pause_config(store, suite, config, reason,
                     f"config {config} of suite {suite} paused: {reason}; its other configs run on; {fix}")
        return
    # the last config of the suite still running: the suite pauses (one pause, one event)
    configs = len({config, *(p.config for p in paused_configs(store, count_queued=False) if p.suite == suite)})
    suite_reason = reason if configs == 1 else f"all {configs} configs paused by the crash-loop guard, the last for {reason}"
    pause_suite(store, suite, suite_reason, f"suite {suite} paused: {suite_reason}; {fix}")


def fail_before_start(
    store: Store, attempt: Attempt, reason: str, *, disk_full: bool = False, not_counted: bool = False,
) -> None:
    """The run dir or launcher failed before the worker existed: the attempt fails with that
    reason; the job is requeued while attempts remain (the daemon itself keeps running). A full
    disk is not the job's fault, nor a cluster too busy to take it (`not_counted`): requeued
    without counting the attempt."""
    disk_full_or_busy = disk_full or not_counted
    job = job_by_id(store, attempt.job_id)
    assert job is not None  # attempts reference their job (a foreign key)
    requeue = disk_full_or_busy or job.attempt_count < job.max_attempts
    fields: dict[str, Any] = {"reason": None if requeue else clip_reason(reason)}
    if disk_full_or_busy:
        fields["max_attempts"] = job.max_attempts + 1
    close_attempt(
        store, attempt,
        AttemptEnd(
            outcome=(AttemptOutcome.LOST if disk_full_or_busy else AttemptOutcome.FAILED).value, reason=clip_reason(reason),
            exit_code=None, signal=None, peak_mib=0,
            job_state=JobState.QUEUED if requeue else JobState.FAILED,
            job_fields=fields,
            message=f"attempt {attempt.n} failed to start: {reason}" + ("; requeued" if requeue else ""),
            data={"run_dir": attempt.run_dir}, reported=RunReading(None).to_record(),  # it reported nothing
        ),
    )
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
