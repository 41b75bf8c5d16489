"""Immutable GPU readings. Probes return these; the packer and the dashboard read only these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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

    def to_json(self) -> dict[str, Any]:
        """`dataclasses.asdict` of it, written out: the daemon records every card at every pass."""
        return {
            "index": self.index, "uuid": self.uuid, "name": self.name, "total_mib": self.total_mib,
            "used_mib": self.used_mib, "free_mib": self.free_mib, "utilization_pct": self.utilization_pct,
            "processes": [{"pid": p.pid, "used_mib": p.used_mib} for p in self.processes],
        }

    def memory_of(self, pids: frozenset[int] | set[int]) -> int:
        """MiB held on this GPU by the given pids (e.g. one attempt's process tree)."""
        return sum(p.used_mib for p in self.processes if p.pid in pids)
