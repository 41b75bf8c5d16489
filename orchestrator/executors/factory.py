"""Choosing the executor: Slurm when asked, else tmux when it is installed, else plain subprocesses."""

from __future__ import annotations

import logging
import os
import shutil

from orchestrator.errors import UsageError
from orchestrator.executors.backends import EXECUTOR_NAMES, LOCAL_EXECUTOR_NAMES
from orchestrator.executors.base import Executor

log = logging.getLogger(__name__)


def make_local_executor(kind: str | None, socket_name: str) -> Executor:
    """`kind` (else env ORCH_LAUNCHER, else tmux when it is installed, else subprocess)."""
    chosen = (kind or os.environ.get("ORCH_LAUNCHER") or "").strip().lower()
    if chosen not in ("", *LOCAL_EXECUTOR_NAMES):
        raise UsageError(f"unknown launcher {chosen!r}: use {' or '.join(LOCAL_EXECUTOR_NAMES)}")
    if not chosen:
        if shutil.which("tmux"):
            chosen = "tmux"
        else:
            log.warning(
                "tmux is not installed: workers run as plain subprocesses (no `orch attach`)"
            )
            chosen = "subprocess"
    if chosen == "tmux":
        from orchestrator.executors.tmux import TmuxExecutor

        return TmuxExecutor(socket_name)
    from orchestrator.executors.subprocesses import SubprocessExecutor

    return SubprocessExecutor()


def make_executor(
    kind: str | None,
    socket_name: str,
    slurm_options: object | None = None,
    gpu_mib: int | None = None,
) -> Executor:
    """`kind` tmux/subprocess (else the local default choice) or slurm."""
    if (kind or "").strip().lower() == "slurm":
        from orchestrator.executors.slurm.executor import SlurmExecutor, SlurmOptions

        options = slurm_options if isinstance(slurm_options, SlurmOptions) else SlurmOptions()
        return SlurmExecutor(options, gpu_mib=gpu_mib)
    if kind and kind not in EXECUTOR_NAMES:
        raise UsageError(f"unknown executor {kind!r}: use one of {', '.join(EXECUTOR_NAMES)}")
    return make_local_executor(kind, socket_name)
