"""orch's exception tree. Every failure of an external system is turned into one of these,
with a message a user can act on; the CLI maps them to exit codes in one place."""

from __future__ import annotations


class OrchError(Exception):
    """Root of orch's errors. `exit_code` is what the CLI exits with."""

    exit_code = 1


class UsageError(OrchError):
    """Bad input from the user: a malformed plan, pair, round, suite, --set value, ..."""

    exit_code = 2


class PlanError(UsageError):
    """A suite file, config file or plan value is invalid."""


class SuiteNotFound(PlanError):
    """No suite file of that name in the plans folder."""


class StoreError(OrchError):
    """state.db is unreadable, corrupt, locked or from a newer orch."""


class DatabaseDiskFull(StoreError):
    """state.db could not be written: its filesystem is full (SQLITE_FULL). Nothing about a
    job follows from it: what was to be written is written again once there is room."""


class MissingDatabase(StoreError):
    """A command that only reads was pointed at a state.db that does not exist."""

    exit_code = 2


class InvalidTransition(StoreError):
    """A job state change that the transition table forbids."""


class JobNotFound(UsageError):
    """No job with that id."""


class GpuUnavailable(OrchError):
    """NVML (or the simulated backend) cannot be read."""


class LauncherError(OrchError):
    """tmux or the subprocess launcher could not start, find or stop a worker."""


class OrchShortOf(LauncherError):
    """orch itself could not start a worker: out of file descriptors, processes or memory, or
    its tmux server failed. Nothing about the job follows: it is requeued without counting and
    without tripping the crash-loop guard."""


# errno values that say this process (or the machine) ran short, not that a job is wrong
RESOURCE_ERRNOS = frozenset({24, 23, 12, 11})  # EMFILE, ENFILE, ENOMEM, EAGAIN (fork: too many processes)


def is_orch_shortage(exc: BaseException) -> bool:
    """The error is orch's own shortage (OrchShortOf, or an OSError of RESOURCE_ERRNOS)."""
    return isinstance(exc, OrchShortOf) or (isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS)


class ClusterBusy(LauncherError):
    """The cluster refused a submission for now (a busy controller): submit it again later,
    without counting it against the job."""


class DaemonError(OrchError):
    """The daemon is already running, not running, or could not be started/stopped."""


class MpsError(OrchError):
    """The CUDA MPS control daemon could not be started, asked or stopped."""
