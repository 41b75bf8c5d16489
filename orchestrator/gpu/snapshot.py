"""Immutable GPU readings. Probes return these; the packer and the dashboard read only these."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProcessMemory:
    """GPU memory one process holds on one GPU, as the probe saw it."""

    pid: int
    used_mib: int


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU at one moment. `used_mib` includes every process, ours and foreign."""

    index: int
    uuid: str
    name: str
    total_mib: int
    used_mib: int
    free_mib: int
    utilization_pct: int | None = None
    processes: tuple[ProcessMemory, ...] = field(default_factory=tuple)

    def memory_of(self, pids: frozenset[int] | set[int]) -> int:
        """MiB held on this GPU by the given pids (e.g. one attempt's process tree)."""
        return sum(p.used_mib for p in self.processes if p.pid in pids)
