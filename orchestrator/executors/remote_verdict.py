"""Pure: what a cluster-owned attempt's run dir and its backend status mean together.

The run dir wins: an exit record ends the attempt as every executor's does. Without one, only
the backend's own word ends it (NODE_FAIL, PREEMPTED, BOOT_FAIL: lost and requeued; TIMEOUT and
the like: failed), with the backend's state in the reason. An unanswered poll concludes nothing.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.executors.base import RemoteStatus
from orchestrator.lifecycle import AttemptOutcome, KillRequest
from orchestrator.reconcile import LAUNCH_GRACE_S, Observation
from orchestrator.store.rows import Attempt

RemoteEnd = tuple[AttemptOutcome, str, bool]  # outcome, reason, retryable


def remote_observation(obs: Observation, status: RemoteStatus | None) -> Observation:
    """The process is alive while the backend says the job runs (its pid is on another node)."""
    running = status is not None and status.kind == "running" and obs.pid_record is not None
    return replace(obs, process_alive=running)


def remote_end(
    attempt: Attempt, obs: Observation, status: RemoteStatus | None, polled: bool,
    daemon_started_at_s: float | None,
) -> str | RemoteEnd | None:
    """"finished" (exit record), an end decided by the backend, or None (still live / unknown)."""
    if obs.exit_record is not None:
        return "finished"
    if status is None:
        never_submitted = (
            polled and not attempt.executor_id and attempt.launcher is None
            and daemon_started_at_s is not None and attempt.started_at < daemon_started_at_s
        )
        if never_submitted:  # claimed by a daemon that died before sbatch, and not in the queue
            return (AttemptOutcome.LOST, "claimed by a daemon that stopped before submitting it", True)
        unanswered = polled and attempt.launcher and not attempt.executor_id and obs.now_s - attempt.started_at > LAUNCH_GRACE_S
        if unanswered:  # sbatch timed out and no job of its name was ever seen in the queue
            return (AttemptOutcome.LOST, "sbatch did not answer and no job of its name is in Slurm's queue", True)
        return None
    job = f"Slurm job {status.job_id or attempt.executor_id}"
    if status.kind in ("queued", "running"):
        return None
    if status.kind == "lost":
        return (AttemptOutcome.LOST, f"{job} ended {status.state}", True)
    if status.kind == "failed":
        return (AttemptOutcome.FAILED, f"{job} ended {status.state}", False)
    if attempt.kill_requested in (KillRequest.CANCEL, KillRequest.RETRY):
        return (AttemptOutcome.CANCELLED, f"{job} cancelled (scancel)", True)
    return (AttemptOutcome.LOST, f"{job} ended {status.state} without an exit record", True)
