"""Job states, attempt outcomes and the one transition table every state write is checked against."""

from __future__ import annotations

from enum import Enum

from orchestrator.errors import InvalidTransition


class JobState(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PRUNED = "pruned"  # stopped by the suite's early_stop rule: not failed, never retried by itself


class AttemptOutcome(str, Enum):
    SUCCEEDED = "succeeded"
    OOM = "oom"
    HOST_OOM = "host_oom"
    FAILED = "failed"
    LOST = "lost"
    CANCELLED = "cancelled"
    PRUNED = "pruned"  # stopped by early stopping: no evidence against the job
    # its fused group (`share_base: fused`, >= 2 jobs in one process) ran out of memory: not the
    # job's own need; requeued uncounted at its level, the suite's fused groups made smaller
    GROUP_OOM = "group_oom"


class KillRequest(str, Enum):
    """Why an attempt is to be stopped (attempts.kill_requested)."""

    CANCEL = "cancel"  # orch cancel: the job ends cancelled
    RETRY = "retry"  # orch retry: the job is requeued
    HUNG = "hung"  # silent past its hang timeout: killed by the daemon
    PRUNE = "prune"  # the suite's early_stop rule judged its setting hopeless: the job ends pruned


TERMINAL_STATES: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PRUNED}
)
# The same, as the values stored, in the enum's order (how counts and notifications list them);
# every other spelling of "a job that has ended" is derived from these two.
TERMINAL_VALUES: tuple[str, ...] = tuple(s.value for s in JobState if s in TERMINAL_STATES)

# (from, to) pairs that are allowed. None as `from` is the creation of a job.
# running -> queued is a requeue after an OOM'd, lost or retried-once attempt;
# failed/cancelled/pruned -> queued is `orch retry`; queued -> pruned: a seed of a pruned setting
# that had not started.
ALLOWED_TRANSITIONS: frozenset[tuple[JobState | None, JobState]] = frozenset(
    {
        (None, JobState.QUEUED),
        (JobState.QUEUED, JobState.RUNNING),
        (JobState.QUEUED, JobState.CANCELLED),
        (JobState.QUEUED, JobState.FAILED),  # e.g. the ladder can offer nothing that fits any GPU
        (JobState.RUNNING, JobState.SUCCEEDED),
        (JobState.RUNNING, JobState.FAILED),
        (JobState.RUNNING, JobState.CANCELLED),
        (JobState.RUNNING, JobState.QUEUED),
        (JobState.FAILED, JobState.QUEUED),
        (JobState.CANCELLED, JobState.QUEUED),
        (JobState.QUEUED, JobState.PRUNED),
        (JobState.RUNNING, JobState.PRUNED),
        (JobState.PRUNED, JobState.QUEUED),
    }
)


def is_allowed(from_state: JobState | None, to_state: JobState) -> bool:
    return (from_state, to_state) in ALLOWED_TRANSITIONS


def check_transition(from_state: JobState | None, to_state: JobState) -> None:
    """Raise InvalidTransition unless the table allows from_state -> to_state."""
    if not is_allowed(from_state, to_state):
        shown_from = from_state.value if from_state is not None else "(new)"
        raise InvalidTransition(f"job state change {shown_from} -> {to_state.value} is not allowed")


REASON_HUNG = "hung"
