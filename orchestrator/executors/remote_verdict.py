"""Pure: what a cluster-owned attempt's run dir and its backend status mean together.

The run dir wins for an attempt that ended by itself: its exit record is classified as every
executor's is. An attempt stopped from outside (the wrapper names SIGTERM, SIGHUP or the time
limit's warning SIGUSR2, or the worker died of SIGKILL) waits for the backend's final word, which
then decides: TIMEOUT fails the job with the limit named, or resumes it where the worker can;
PREEMPTED requeues it without counting; NODE_FAIL and the like are lost; OUT_OF_MEMORY is a host
OOM. A job that left the queue without an exit record is given a grace period for the record to
appear on a shared filesystem before it is lost. An unanswered poll concludes nothing. A submission
that went unanswered is lost once no job of its name is in the queue past the launch grace, measured
as `launch_age` says (never wall time: a clock step moves that by hours); like a claim whose daemon
died before submitting it, it is a launch that never happened, requeued without counting.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from orchestrator.executors.base import RemoteStatus
from orchestrator.executors.launch_age import LaunchAge
from orchestrator.executors.observation import LAUNCH_GRACE_S, Observation
from orchestrator.lifecycle import AttemptOutcome, KillRequest
from orchestrator.store.rows import Attempt

AWAIT = "await"  # stopped from outside: the backend's final word is needed (poll it soon)
FINISHED = "finished"  # the exit record decides, as on one box
WARNING_SIGNAL = "SIGUSR2"  # Slurm's --signal=B:USR2@N before the time limit
OUTSIDE_SIGNALS = frozenset({"SIGTERM", "SIGHUP", WARNING_SIGNAL})
DEFAULT_MAX_TIMEOUTS = 3
TIME_LIMIT_WORDS = "reached its time limit"  # in the reason of every time-limit end


class ClusterEnd(NamedTuple):
    outcome: AttemptOutcome
    reason: str
    retryable: bool = True
    counted: bool = True  # False: requeued without using up one of the job's max_attempts
    next_mem_mib: int | None = None  # a host OOM: the host memory (--mem) the next attempt asks for


@dataclass(frozen=True)
class TimeLimit:
    """What a time limit means for this job: resumed (with its own cap) or failed."""

    can_resume: bool = False
    timeouts_before: int = 0  # earlier attempts of the job that ended at their time limit
    max_timeouts: int = DEFAULT_MAX_TIMEOUTS
    limit: str | None = None  # the suite's slurm time, as written


def remote_observation(obs: Observation, status: RemoteStatus | None) -> Observation:
    """The process is alive while the backend says the job runs (its pid is on another node)."""
    running = status is not None and status.kind == "running" and obs.pid_record is not None
    return replace(obs, process_alive=running)


def refresh_dir(path: str) -> None:
    """List the run dir: on NFS this revalidates the directory's cached attributes, so a file
    the node wrote is seen before its absence is concluded."""
    with contextlib.suppress(OSError):
        os.listdir(path)


def received_signals(exit_record: dict[str, Any]) -> frozenset[str]:
    received = exit_record.get("received")
    if not isinstance(received, list):
        return frozenset()
    return frozenset(name for name in received if isinstance(name, str))


def _signalled(exit_record: dict[str, Any]) -> bool:
    """The worker died of SIGKILL (a cgroup's OOM kill, Slurm's OUT_OF_MEMORY, looks so here),
    or ended on a SIGTERM the wrapper had not yet noted: Slurm signals the job's every process,
    and a worker that ends at once can beat its wrapper's handler (a preemption then read as an
    exit code of 143, failed and counted)."""
    return any(
        exit_record.get("signal") == sig or exit_record.get("exit_code") == 128 + sig
        for sig in (signal.SIGKILL, signal.SIGTERM)
    )


def remote_end(
    attempt: Attempt, obs: Observation, status: RemoteStatus | None, polled: bool,
    launch: LaunchAge | None, time_limit: TimeLimit | None = None,
) -> str | ClusterEnd | None:
    """FINISHED (the exit record decides), AWAIT, an end decided by the backend, or None
    (still live / unknown). `launch`: how long ago its launch was asked (None: not known, so
    no launch is given up on)."""
    job = f"Slurm job {(status.job_id if status else '') or attempt.executor_id}"
    stopped_by_orch = attempt.kill_requested is not None
    if obs.exit_record is not None:
        received = received_signals(obs.exit_record)
        if stopped_by_orch or not (received & OUTSIDE_SIGNALS or _signalled(obs.exit_record)):
            return FINISHED
        if status is None or not status.ended:
            return AWAIT
        if status.kind == "ended":  # the batch step ended by itself: only the warning tells more
            if WARNING_SIGNAL not in received or obs.exit_record.get("exit_code") == 0:
                return FINISHED
            return _timed_out(job, time_limit)
        return _cluster_end(job, status, time_limit)
    if status is None:
        never_submitted = (
            polled and not attempt.executor_id and attempt.executor is None and launch is not None and launch.adopted
        )
        if never_submitted:  # claimed by a daemon that died before sbatch, and not in the queue
            return ClusterEnd(
                AttemptOutcome.LOST,
                "claimed by a daemon that stopped before submitting it",
                counted=False,
            )
        unanswered = (polled and attempt.executor and not attempt.executor_id and launch is not None
                      and launch.age_s > LAUNCH_GRACE_S)
        if unanswered and launch is not None:  # sbatch timed out and no job of its name was ever seen in the queue
            return ClusterEnd(AttemptOutcome.LOST, "sbatch did not answer and no job of its name is in Slurm's queue "
                                                   f"({launch.said()})", counted=False)
        return None
    if not status.ended:
        return None
    if stopped_by_orch and attempt.kill_requested in (KillRequest.CANCEL, KillRequest.RETRY, KillRequest.PRUNE):
        return ClusterEnd(AttemptOutcome.CANCELLED, f"{job} cancelled (scancel)")
    if not status.settled:  # its exit record may not be visible here yet (a shared filesystem's delay)
        return None
    if status.kind == "ended":
        return ClusterEnd(AttemptOutcome.LOST, f"{job} ended {status.state} and no exit record appeared")
    return _cluster_end(job, status, time_limit)


def _cluster_end(job: str, status: RemoteStatus, time_limit: TimeLimit | None) -> ClusterEnd:
    if status.kind == "timeout":
        return _timed_out(job, time_limit)
    if status.kind == "preempted":
        return ClusterEnd(
            AttemptOutcome.LOST,
            f"{job} was preempted ({status.state}): requeued, not counted",
            counted=False,
        )
    if status.kind == "host_oom":  # the cgroup's kill: more host memory, same settings otherwise
        more = 2 * status.mem_mib if status.mem_mib else None
        then = f"; the next attempt asks for --mem={more}M" if more else ""
        return ClusterEnd(AttemptOutcome.HOST_OOM, f"{job} ended {status.state}: over its host memory (--mem){then}",
                          next_mem_mib=more)
    if status.kind == "lost":
        return ClusterEnd(AttemptOutcome.LOST, f"{job} ended {status.state}")
    return ClusterEnd(AttemptOutcome.FAILED, f"{job} ended {status.state}", retryable=False)


def _timed_out(job: str, time_limit: TimeLimit | None) -> ClusterEnd:
    policy = time_limit or TimeLimit()
    limit = f"--time={policy.limit}" if policy.limit else "the partition's default"
    if policy.can_resume and policy.timeouts_before < policy.max_timeouts:
        return ClusterEnd(
            AttemptOutcome.LOST,
            f"{job} {TIME_LIMIT_WORDS} ({limit}); the next attempt resumes from its checkpoint "
            f"(time limit {policy.timeouts_before + 1} of at most {policy.max_timeouts})",
            counted=False,
        )
    if policy.can_resume:
        return ClusterEnd(
            AttemptOutcome.FAILED,
            f"{job} {TIME_LIMIT_WORDS} ({limit}) {policy.timeouts_before + 1} times (slurm max_timeouts "
            f"{policy.max_timeouts})", retryable=False,
        )
    return ClusterEnd(
        AttemptOutcome.FAILED,
        f"{job} {TIME_LIMIT_WORDS} ({limit}); a rerun from scratch would reach it again: raise slurm time, "
        "or let the worker resume ({resume} in its template, or resume_from_checkpoint)", retryable=False,
    )
