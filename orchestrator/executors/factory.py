"""Choosing the launcher: tmux when it is installed, else plain subprocesses."""

from __future__ import annotations

import logging
import os
import shutil

from orchestrator.errors import UsageError
from orchestrator.executors.base import Executor
from orchestrator.executors.local import LocalExecutor
from orchestrator.executors.process_groups import LAUNCHERS, Launcher

log = logging.getLogger(__name__)


def make_launcher(kind: str | None, socket_name: str) -> Launcher:
    """`kind` (else env ORCH_LAUNCHER, else tmux when it is installed, else subprocess)."""
    chosen = (kind or os.environ.get("ORCH_LAUNCHER") or "").strip().lower()
    if chosen not in ("", *LAUNCHERS):
        raise UsageError(f"unknown launcher {chosen!r}: use tmux or subprocess")
    if not chosen:
        if shutil.which("tmux"):
            chosen = "tmux"
        else:
            log.warning(
                "tmux is not installed: workers run as plain subprocesses (no `orch attach`)"
            )
            chosen = "subprocess"
    if chosen == "tmux":
        from orchestrator.executors.tmux import TmuxLauncher

        return TmuxLauncher(socket_name)
    from orchestrator.executors.subprocess_launcher import SubprocessLauncher

    return SubprocessLauncher()


EXECUTORS = ("tmux", "subprocess", "slurm")


def make_executor(kind: str | None, socket_name: str, slurm_options: object | None = None, gpu_mib: int | None = None) -> Executor:
    """`kind` tmux/subprocess (else the launcher's own default choice) or slurm."""
    if (kind or "").strip().lower() == "slurm":
        from orchestrator.executors.slurm.executor import SlurmExecutor, SlurmOptions

        options = slurm_options if isinstance(slurm_options, SlurmOptions) else SlurmOptions()
        return SlurmExecutor(options, gpu_mib=gpu_mib)
    if kind and kind not in EXECUTORS:
        raise UsageError(f"unknown executor {kind!r}: use one of {', '.join(EXECUTORS)}")
    return LocalExecutor(make_launcher(kind, socket_name))


def as_executor(backend: Launcher | Executor) -> Executor:
    """The executor seam for what the daemon was given: an executor as it is, a bare launcher
    (tmux, subprocess) wrapped as a local executor. Only executors/ asks which class it holds."""
    from orchestrator.executors.slurm.executor import SlurmExecutor

    return backend if isinstance(backend, (LocalExecutor, SlurmExecutor)) else LocalExecutor(backend)
