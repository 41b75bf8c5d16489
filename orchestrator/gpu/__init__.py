"""GPU readings: NVML on real machines, simulated GPUs in CI. Both give immutable snapshots."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from orchestrator.errors import GpuUnavailable, UsageError
from orchestrator.gpu.snapshot import GpuSnapshot, ProcessMemory

BACKENDS = ("nvml", "sim")

__all__ = ["BACKENDS", "GpuProbe", "GpuSnapshot", "ProcessMemory", "make_probe"]


class GpuProbe(Protocol):
    """Reads every GPU at once. Snapshots are ordered by index and identified by uuid."""

    def snapshot(self) -> tuple[GpuSnapshot, ...]: ...

    def close(self) -> None: ...


def make_probe(backend: str | None = None, state_dir: Path | None = None) -> GpuProbe:
    """The probe for `backend` (else env ORCH_GPU_BACKEND, else NVML).

    Without an explicit backend, NVML must initialise: otherwise GpuUnavailable says how to
    switch to simulated GPUs. Choosing a fallback is the caller's business.
    `state_dir` is the simulated GPUs' directory (else env ORCH_SIM_DIR); NVML ignores it.
    """
    chosen = (backend or os.environ.get("ORCH_GPU_BACKEND") or "").strip().lower()
    if chosen == "sim":
        from orchestrator.gpu.sim import make_sim_probe

        return make_sim_probe(state_dir)
    if chosen not in ("", "nvml"):
        raise UsageError(f"unknown GPU backend {chosen!r}: use one of {', '.join(BACKENDS)}")

    from orchestrator.gpu.nvml import NvmlProbe

    probe = NvmlProbe()
    try:
        probe.snapshot()  # fail now, with NVML's reason, rather than at the first tick
    except GpuUnavailable:
        probe.close()
        raise
    return probe


def machine_gpu_indices() -> list[int] | None:
    """The GPU indices this machine has, read without side effects (the simulated GPUs from
    ORCH_SIM_GPUS, else NVML); None when they cannot be known here."""
    if (os.environ.get("ORCH_GPU_BACKEND") or "").strip().lower() == "sim":
        from orchestrator.gpu.sim import parse_gpu_sizes

        try:
            return list(range(len(parse_gpu_sizes(os.environ.get("ORCH_SIM_GPUS", "")))))
        except UsageError:
            return None
    from orchestrator.gpu.nvml import NvmlProbe

    probe = NvmlProbe()
    try:
        return [s.index for s in probe.snapshot()] or None
    except GpuUnavailable:
        return None
    finally:
        probe.close()
