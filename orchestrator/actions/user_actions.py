"""Cancel, retry, resume: the changes a user asks for, shared by the CLI and the web page."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from enum import Enum

from orchestrator.actions.presence import daemon_alive
from orchestrator.attempts.classify import Classification
from orchestrator.attempts.ended import end_of_exited
from orchestrator.attempts.reconcile import group_is_ours
from orchestrator.errors import InvalidTransition, UsageError
from orchestrator.lifecycle import AttemptOutcome, JobState, KillRequest
from orchestrator.store.control import request_stop, start_fresh, unpause_suite
from orchestrator.store.db import Store
from orchestrator.store.jobs import cancel_queued, transition
from orchestrator.store.queries import get_job, live_attempt
from orchestrator.store.rows import Job
from orchestrator.wording import fmt_value


class Done(str, Enum):
    CANCELLED = "cancelled"  # a queued job, now cancelled
    REQUEUED = "requeued"  # a failed, cancelled or pruned job, queued again
    STOPPING = "stopping"  # a running job: the daemon stops it and records the end
    FINISHED = "finished"  # a running job whose worker already succeeded: its result is kept
    SKIPPED = "skipped"  # nothing to do in its state


# a pruned job resumes from its checkpoint; its setting is no longer judged by early stopping
_REQUEUED_BY_RETRY = (JobState.FAILED, JobState.CANCELLED, JobState.PRUNED)
# each try sees the job in a newer state; a job changes state a handful of times in its life
_CHANGE_TRIES = 8
_ENDING_WAIT_S = 0.1  # between reads of a job whose end the daemon is recording


def _stop_running(store: Store, job_id: int, why: KillRequest) -> bool:
    """Ask for the live attempt to be stopped; the daemon records the end. Without a daemon,
    kill the process group here so nothing keeps running unseen."""
    live = request_stop(store, job_id, why)
    if live is None:
        return False
    # only the process the launcher started, proven by its start time; never a pid from a file
    if (
        daemon_alive(store) is None
        and live.pid
        and live.proc_create_time is not None
        and group_is_ours(live.pid, live.proc_create_time)
    ):
        from orchestrator.executors.process_groups import kill_process_group

        kill_process_group(int(live.pid))
    return True


def _exited_end(store: Store, job: Job) -> Classification | None:
    """How the job's live attempt ended, when its worker already exited on its own (the daemon
    was stopped or paused and has not recorded it yet); None while it runs."""
    attempt = live_attempt(store, job.id)
    return end_of_exited(attempt, job) if attempt is not None else None


def cancel_job(store: Store, job_id: int) -> Done:
    """Raises JobNotFound for an unknown id. A running job whose worker already succeeded is
    left to finish as it did (the daemon records its success); one whose worker ended otherwise
    is cancelled, its attempt keeping the outcome it had. The daemon moves jobs meanwhile (a
    queued job starts, a running one ends): the job is read again and cancelled in the state
    it is in now."""
    for _ in range(_CHANGE_TRIES):
        job = get_job(store, job_id)
        if job.state is JobState.QUEUED:
            try:
                cancel_queued(store, job_id, "cancelled by user")
            except InvalidTransition:
                continue  # it left the queue between the read and the write
            return Done.CANCELLED
        if job.state is not JobState.RUNNING:
            return Done.SKIPPED
        ended = _exited_end(store, job)
        if ended is not None and ended.outcome is AttemptOutcome.SUCCEEDED:
            return Done.FINISHED
        if _stop_running(store, job_id, KillRequest.CANCEL):
            return Done.STOPPING
        # running without a live attempt: it is ending (or being requeued) now; read it again
    return Done.SKIPPED


def retry_job(
    store: Store, job_id: int, *, fresh: bool = False, before_requeue: Callable[[Job], None] | None = None,
) -> Done:
    """Requeue a failed, cancelled or pruned job (attempt budget renewed); restart a running one. With
    `fresh`, its next attempt starts without a checkpoint (none of its attempts so far is
    resumed from). `before_requeue` runs just before a failed or cancelled job is requeued.
    Raises UsageError for a job in any other state, JobNotFound for an unknown id.

    The daemon moves jobs meanwhile (a running one ends: failed, requeued, succeeded): each
    write holds only while the job is still in the state just read, and the job is otherwise
    read again and retried in the state it is in now."""
    for tries in range(_CHANGE_TRIES):
        job = get_job(store, job_id)
        if tries and job.state is JobState.QUEUED:
            # it ended while the retry was asked and the daemon queued it again by itself
            if not fresh or start_fresh(store, job_id, JobState.QUEUED):
                return Done.REQUEUED
            continue  # it started meanwhile: stop that attempt instead
        job = check_retryable(store, job_id, job)
        if fresh and not start_fresh(store, job_id, job.state):
            continue
        if job.state in _REQUEUED_BY_RETRY:
            if before_requeue is not None:
                before_requeue(job)
            try:
                transition(
                    store, job_id, JobState.QUEUED, message="requeued by orch retry" + (" --fresh" if fresh else ""),
                    kind="retry", expect_from=[job.state],
                    # its attempts renewed; every attempt so far counts against the new limit, and
                    # its resumes start again from none
                    fields={"reason": None, "resumes": 0,
                            "max_attempts": job.attempt_count + max(job.max_attempts, 1)},
                )
            except InvalidTransition:
                continue  # requeued by another retry, or resubmitted, between the read and the write
            return Done.REQUEUED
        if _stop_running(store, job_id, KillRequest.RETRY):
            return Done.STOPPING
        # running without a live attempt: the daemon is recording its end; read it again shortly
        time.sleep(_ENDING_WAIT_S)
    raise UsageError(f"job {job_id} is changing state (its end is being recorded) while being retried; "
                     "try again in a moment")


def check_retryable(store: Store, job_id: int, job: Job | None = None) -> Job:
    """The job (`job`, when just read), when a retry can take it (failed, cancelled, pruned or running);
    else UsageError, naming what to do instead. Writes nothing."""
    job = get_job(store, job_id) if job is None else job
    if job.state is JobState.RUNNING:
        ended = _exited_end(store, job)
        if ended is not None and ended.outcome is AttemptOutcome.SUCCEEDED:
            raise UsageError(
                _succeeded_already(
                    job, f"job {job_id} is recorded as running, but its worker already succeeded"
                )
            )
    if job.state in (*_REQUEUED_BY_RETRY, JobState.RUNNING):
        return job
    if job.state is JobState.SUCCEEDED:
        raise UsageError(_succeeded_already(job, f"job {job_id} succeeded"))
    raise UsageError(
        f"job {job_id} is {job.state.value}: only failed, cancelled, pruned or running jobs can be retried"
    )


def _succeeded_already(job: Job, said: str) -> str:
    """Why a succeeded job is not retried, and the command that runs it again."""
    sets = "".join(f" --set {shlex.quote(f'{key}={fmt_value(value)}')}" for key, value in job.overrides.items())
    pairs = f"{job.seed}:{job.data}" if job.data else str(job.seed)
    option = "--pairs" if job.data else "--seeds"
    return (f"{said}: a retry is for failed, cancelled, pruned or running jobs; to run it again, "
            f"`orch submit --suite {job.suite} --config {shlex.quote(job.config_name)} {option} "
            f"{shlex.quote(pairs)}{sets} --force`")


def resume_suite(store: Store, suite: str) -> None:
    """Raises UsageError when the suite is not paused."""
    if not unpause_suite(store, suite):
        raise UsageError(f"suite {suite!r} is not paused")
