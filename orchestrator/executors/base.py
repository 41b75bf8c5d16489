"""The executor seam: one interface owns an attempt's life on a backend (tmux, subprocess, Slurm).

submit -> an opaque `executor_id` kept on the attempt row (a tmux window, a Slurm job id);
observe once per tick for every live attempt at once; stop; attach (an argv, or NotAttachable);
cleanup once the attempt's end is recorded; close when the daemon stops with nothing running.
The run dir stays the source of truth (pid.json, exit.json, stdout.log, result.json): an
executor only adds what its backend knows (a Slurm job's state, a tmux pane still running).
Every method has a meaning for every backend, so the daemon never asks which one it holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from orchestrator.errors import LauncherError, OrchError, UsageError
from orchestrator.executors.backends import CLUSTER_EXECUTOR_NAMES
from orchestrator.rundir_files import RunDir
from orchestrator.store.rows import Attempt, Job

SUBMIT_THREADS = 8  # windows or sbatch calls of one pass made side by side (they wait, not compute)


class NotAttachable(UsageError):
    """The attempt runs where there is nothing to attach to (no tmux window here)."""


@dataclass(frozen=True)
class LaunchSpec:
    """One attempt to start. `env` is added on top of the executor's inherited environment;
    the worker runs in `cwd` (default: the daemon's own working directory, so a template such
    as "python train.py" finds the user's script), and the executor creates `run_dir` if needed.
    The executor starts `wrapper_argv(run_dir, argv)`: the wrapper records pid.json and
    exit.json in the run dir, which is how the daemon learns the pgid to stop and the exit."""

    job_id: int
    attempt_id: int
    window_name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    run_dir: Path = Path(".")
    cwd: Path | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # what a remote executor sizes its request by


@dataclass(frozen=True)
class LaunchHandle:
    """How to find a started attempt again: recorded on its row as executor and executor_id."""

    executor: str  # a backend's name (executors.backends)
    pid: int | None  # the wrapper's pid where it runs on this host
    executor_id: str | None = None  # the backend's own id: a tmux window id, a Slurm job id


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

    @property
    def ended(self) -> bool:
        """The job has left the backend's queue (finished, failed, cancelled, lost...)."""
        return self.kind not in ("queued", "running")


T = TypeVar("T")
R = TypeVar("R")


def in_threads(work: Callable[[T], R], items: Sequence[T], threads: int = SUBMIT_THREADS) -> list[R]:
    """`work` over `items` side by side (each waits on I/O), results in order."""
    if len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(threads, len(items))) as pool:
        return list(pool.map(work, items))


class Executor(ABC):
    """What every backend offers. `submit`, `observe` and `stop` are abstract: a backend says
    what each means for it (a local one: LocalExecutor), so none silently does nothing. The other
    defaults are what a backend with nothing to add does."""

    name: ClassVar[str]
    # The backend owns the process (it runs on another node): liveness and stopping go through
    # it, never through a process group on this host.
    remote: ClassVar[bool] = False
    answered_now: bool = True  # the last observe() asked the backend (False: its last answer again)

    # -- submit --------------------------------------------------------------------------------

    @abstractmethod
    def submit(self, spec: LaunchSpec) -> LaunchHandle:
        """Start one attempt; LauncherError (or OrchShortOf) when it cannot be started."""

    def submit_many(self, specs: Sequence[LaunchSpec]) -> list[LaunchHandle | Exception]:
        """A pass's attempts, each started or the error that kept it from starting, in order."""
        return in_threads(self._submit_or_error, specs)

    def _submit_or_error(self, spec: LaunchSpec) -> LaunchHandle | Exception:
        try:
            return self.submit(spec)
        except (OSError, ValueError, OrchError, LauncherError) as exc:  # ValueError: a NUL in an argument
            return exc

    def submit_hold(self) -> str | None:
        """Why nothing may be submitted now (a backend that refused lately), else None."""
        return None

    # -- observe -------------------------------------------------------------------------------

    @abstractmethod
    def observe(self, attempts: Sequence[tuple[Attempt, Job]]) -> dict[int, RemoteStatus] | None:
        """Status by attempt id for the live attempts (each with its job) this executor owns;
        None when the backend could not be asked this tick (nothing may be concluded from that)."""

    def started_alive(self, attempt: Attempt) -> bool | None:
        """Whether what the executor started for the attempt still runs, where it can tell
        before the wrapper's pid.json exists (a tmux pane); None where it cannot."""
        return None

    def expedite(self) -> None:
        """An attempt waits for the backend's final word: ask it again soon."""
        return None  # a hook: a backend that answers at once has nothing to hurry

    # -- stop ----------------------------------------------------------------------------------

    @abstractmethod
    def stop(self, attempt: Attempt, job: Job) -> None:
        """Ask the backend to stop an attempt it owns (Slurm: scancel)."""

    def cleanup(self, attempts: Sequence[Attempt]) -> None:
        """Called once these attempts' ends are recorded: close what the backend kept open for
        them (in as few calls as it can)."""
        return None  # a hook: a backend that kept nothing open has nothing to close

    def close(self) -> None:
        """The daemon stops with no attempt running: nothing orch started for itself stays."""
        return None  # a hook: a backend that started nothing for itself has nothing to end

    # -- attach --------------------------------------------------------------------------------

    def attach(self, attempt: Attempt) -> list[str]:
        """The argv that shows the running attempt; NotAttachable where there is none."""
        raise NotAttachable(f"attempt {attempt.id} has no window here ({self.name} executor): "
                            f"use `orch logs {attempt.job_id} -f`")

    def logs(self, attempt: Attempt) -> Path:
        return log_path(attempt)


class LocalExecutor(Executor):
    """A backend that runs attempts on this host (tmux, subprocess): the run dir and the process
    table say all there is, and an attempt is stopped by its proven process group."""

    def observe(self, attempts: Sequence[tuple[Attempt, Job]]) -> dict[int, RemoteStatus] | None:
        return {}  # nothing to add to the run dir and the process table

    def stop(self, attempt: Attempt, job: Job) -> None:
        """Nothing here: the daemon stops the attempt by its proven process group."""


def is_cluster_executor(name: str | None) -> bool:
    """Whether the executor of this name hands attempts to a cluster (they run elsewhere)."""
    return name in CLUSTER_EXECUTOR_NAMES


def cluster_owned(attempt: Attempt) -> bool:
    """Whether the attempt's processes belong to a cluster's executor, from its row alone."""
    return is_cluster_executor(attempt.executor)


def log_path(attempt: Attempt) -> Path:
    """Where every executor's attempt output is: the wrapper writes it into the run dir."""
    return RunDir(attempt.run_dir).log


def attach_argv(attempt: Attempt, tmux_socket: str) -> list[str]:
    """What `orch attach` runs for an attempt, from its row alone (no backend is asked)."""
    job = attempt.job_id
    if is_cluster_executor(attempt.executor):
        raise NotAttachable(
            f"job {job} runs in Slurm job {attempt.executor_id or '(not yet submitted)'}: not attachable here; "
            f"use `orch logs {job} -f` (the output is in its run dir)"
        )
    if attempt.executor != "tmux" or not attempt.executor_id:
        raise NotAttachable(
            f"job {job} has no tmux window (not started, or run without tmux): use `orch logs {job} -f`"
        )
    return ["tmux", "-L", tmux_socket, "attach-session", "-t", attempt.executor_id]
