"""Where attempts run: `tmux` (default), `subprocess`, `slurm`. See executors.base for the seam."""

from __future__ import annotations

from orchestrator.errors import UsageError
from orchestrator.executors.base import Executor, NotAttachable, RemoteStatus
from orchestrator.executors.local import LocalExecutor

EXECUTORS = ("tmux", "subprocess", "slurm")

__all__ = ["EXECUTORS", "Executor", "LocalExecutor", "NotAttachable", "RemoteStatus", "make_executor"]


def make_executor(kind: str | None, socket_name: str, slurm_options: object | None = None, gpu_mib: int | None = None) -> Executor:
    """`kind` tmux/subprocess (else the launcher's own default choice) or slurm."""
    if (kind or "").strip().lower() == "slurm":
        from orchestrator.executors.slurm import SlurmExecutor, SlurmOptions

        options = slurm_options if isinstance(slurm_options, SlurmOptions) else SlurmOptions()
        return SlurmExecutor(options, gpu_mib=gpu_mib)
    if kind and kind not in EXECUTORS:
        raise UsageError(f"unknown executor {kind!r}: use one of {', '.join(EXECUTORS)}")
    from orchestrator.launch.factory import make_launcher

    return LocalExecutor(make_launcher(kind, socket_name))
