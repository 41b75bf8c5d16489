"""Immutable GPU readings. Probes return these; the packer and the dashboard read only these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProcessMemory:
    """GPU memory one process holds on one GPU, as the probe saw it."""

    pid: int
    used_mib: int
    sm_pct: int | None = None  # its share of the card's SMs lately (NVML); None: not known


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
            "processes": [{"pid": p.pid, "used_mib": p.used_mib, "sm_pct": p.sm_pct}
                          for p in self.processes],
        }

    def memory_of(self, pids: frozenset[int] | set[int]) -> int:
        """MiB held on this GPU by the given pids (e.g. one attempt's process tree)."""
        return sum(p.used_mib for p in self.processes if p.pid in pids)

    def sm_of(self, pids: frozenset[int] | set[int]) -> int | None:
        """The share of this GPU's SMs the given pids used lately (summed, at most 100); None
        when no figure is known for any of them."""
        known = [p.sm_pct for p in self.processes if p.pid in pids and p.sm_pct is not None]
        return min(100, sum(known)) if known else None
