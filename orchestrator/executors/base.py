"""The executor seam: one interface owns an attempt's life on a backend.

submit (`launch`) -> an opaque `executor_id` kept on the attempt row; `poll` once per tick for
every live attempt at once; `cancel`; `logs`; `attach` (an argv, or NotAttachable); `cleanup`
once the attempt's end is recorded. The run dir stays the source of truth (pid.json, exit.json,
stdout.log, result.json): an executor only adds what its backend knows (a Slurm job's state).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator.errors import UsageError
from orchestrator.executors.process_groups import LaunchHandle, LaunchSpec
from orchestrator.rundir_files import RunDir
from orchestrator.store.rows import Attempt, Job


class NotAttachable(UsageError):
    """The attempt runs where there is nothing to attach to (no tmux window here)."""


@dataclass(frozen=True)
class RemoteStatus:
    """What a backend that owns the process (Slurm) says about one attempt this tick."""

    state: str  # the backend's own word: PENDING, RUNNING, NODE_FAIL, ...
    kind: str  # executors.slurm.parse.SlurmState value: queued, running, ended, lost, failed
    reason: str = ""  # pending reason, e.g. Resources, Priority
    job_id: str = ""  # the backend's id of the attempt (found by name when it was never recorded)
    # False while the job left the queue less than the shared filesystem's grace ago: its exit
    # record may still be on its way, so its absence proves nothing yet
    settled: bool = True
    mem_mib: int | None = None  # host memory the backend gave the job (Slurm's --mem), where known


class Executor(Protocol):
    name: str
    remote: bool  # True: the backend owns the process (liveness and stopping go through it)

    def launch(self, spec: LaunchSpec) -> LaunchHandle: ...

    def poll(self, attempts: Sequence[tuple[Attempt, Job]]) -> dict[int, RemoteStatus] | None:
        """Status by attempt id for the live attempts (each with its job) this executor owns;
        None when the backend could not be asked this tick (nothing may be concluded from that)."""
        ...

    def cancel(self, attempt: Attempt, job: Job) -> None: ...

    def cleanup(self, attempts: Sequence[Attempt]) -> None:
        """Called once these attempts' ends are recorded: close what the backend kept open for
        them (in as few calls as it can)."""
        ...

    def logs(self, attempt: Attempt) -> Path: ...

    def attach(self, attempt: Attempt) -> list[str]:
        """The argv that shows the running attempt; NotAttachable where there is none."""
        ...

    def window_alive(self, handle_window_id: str) -> bool: ...

    def kill_window(self, window_id: str) -> None: ...

    def attach_command(self, window_id: str) -> list[str]: ...


# Executors whose backend owns an attempt's processes (they run on another node): orch can
# neither see nor signal its process group, only ask the backend.
CLUSTER_EXECUTORS = frozenset({"slurm"})


def is_cluster_executor(name: str | None) -> bool:
    """Whether the executor of this name hands attempts to a cluster (they run elsewhere)."""
    return name in CLUSTER_EXECUTORS


def cluster_owned(attempt: Attempt) -> bool:
    """Whether the attempt's processes belong to a cluster's executor, from its row alone."""
    return is_cluster_executor(attempt.executor or attempt.launcher)


def log_path(attempt: Attempt) -> Path:
    """Where every executor's attempt output is: the wrapper writes it into the run dir."""
    return RunDir(attempt.run_dir).log


def attach_argv(attempt: Attempt, tmux_socket: str) -> list[str]:
    """What `orch attach` runs for an attempt, from its row alone (no backend is asked)."""
    executor = attempt.executor or attempt.launcher
    job = attempt.job_id
    if executor == "slurm":
        raise NotAttachable(
            f"job {job} runs in Slurm job {attempt.executor_id or '(not yet submitted)'}: not attachable here; "
            f"use `orch logs {job} -f` (the output is in its run dir)"
        )
    window = attempt.executor_id or attempt.window_id
    if executor != "tmux" or not window:
        raise NotAttachable(f"job {job} has no tmux window (not started, or run without tmux): use `orch logs {job} -f`")
    return ["tmux", "-L", tmux_socket, "attach-session", "-t", str(window)]
