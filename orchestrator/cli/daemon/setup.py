"""How `orch daemon run|start` set the daemon up from their options (cli.daemon.options): the
GPU backend (and the env workers need to see the same GPUs), and the executor attempts run on."""

from __future__ import annotations

import os
from dataclasses import replace

from orchestrator.api.daemon_process import resolve_backend  # noqa: F401 (the CLI's name for it)
from orchestrator.daemon.options import DaemonOptions
from orchestrator.daemon.state import tmux_socket_name
from orchestrator.executors.base import Executor
from orchestrator.gpu import GpuProbe


def check_mps(mps: bool, backend: str | None) -> None:
    """In the user's terminal: --mps needs NVIDIA's control binary on real GPUs (on simulated
    ones it is simulated: orchestrator.gpu.mps.SimulatedControl)."""
    if not mps or (backend or os.environ.get("ORCH_GPU_BACKEND") or "").strip().lower() == "sim":
        return
    from orchestrator.gpu.mps import require_binary

    require_binary()


def make_daemon_executor(options: DaemonOptions, probe: GpuProbe) -> Executor:
    """The executor the options ask for (tmux or subprocess: ORCH_LAUNCHER, else tmux when it
    is installed); Slurm's sized by the largest card the probe sees."""
    from orchestrator.executors.factory import make_executor
    from orchestrator.executors.slurm.executor import SlurmOptions

    options.check_executor()
    socket_name = tmux_socket_name(options.db_path)
    if options.executor_kind == "slurm":
        gpu_mib = max((s.total_mib for s in probe.snapshot()), default=None)
        slurm = SlurmOptions(options.partition, options.account, options.shard_mib, options.max_in_queue)
        if options.slurm_poll_s is not None:
            slurm = replace(slurm, poll_s=options.slurm_poll_s)
        if options.exit_grace_s is not None:
            slurm = replace(slurm, exit_grace_s=options.exit_grace_s)
        return make_executor("slurm", socket_name, slurm, gpu_mib)
    return make_executor(options.executor_kind, socket_name)
