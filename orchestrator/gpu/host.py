"""Host readings: memory and cores of the machine, and what one attempt's process tree takes.

On a real machine these come from psutil: available memory (what the kernel could hand out
without swapping) and the resident memory (RSS) of every process in an attempt's tree, DataLoader
workers included. With simulated GPUs and `ORCH_SIM_HOST="32GiB"` the host is simulated as the
GPUs are: `workers.sim` processes hold `sim_host_gib` in `$ORCH_SIM_DIR/host/`, so tests can fill
the host without exhausting the real one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

from orchestrator.procstat import HAVE_PROC, read_stat, rss_bytes

MIB = 1024 * 1024


@dataclass(frozen=True)
class HostSnapshot:
    total_mib: int
    available_mib: int
    cpus: int


class HostProbe(Protocol):
    def snapshot(self) -> HostSnapshot: ...

    def tree_mib(self, pids: Iterable[int]) -> int: ...


class RealHost:
    """The machine itself, through psutil."""

    def snapshot(self) -> HostSnapshot:
        memory = psutil.virtual_memory()
        return HostSnapshot(memory.total // MIB, memory.available // MIB, os.cpu_count() or 1)

    def tree_mib(self, pids: Iterable[int]) -> int:
        total = 0
        for pid in pids:
            if HAVE_PROC:  # one read of /proc/<pid>/stat, not psutil's several per process
                stat = read_stat(pid)
                total += rss_bytes(stat) if stat is not None else 0
                continue
            try:
                total += psutil.Process(pid).memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # ended between the listing and the reading
        return total // MIB


class SimHost:
    """Simulated host RAM held by sim workers (files of the simulated-GPU protocol)."""

    def __init__(self, state_dir: Path, total_mib: int) -> None:
        self.directory = Path(state_dir) / "host"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.total_mib = total_mib

    def _holders(self) -> list[tuple[int, int]]:
        from orchestrator.gpu.sim_files import read_holders

        holders, _ = read_holders(self.directory)
        return holders

    def snapshot(self) -> HostSnapshot:
        used_mib = sum(mib for _, mib in self._holders())
        return HostSnapshot(self.total_mib, max(0, self.total_mib - used_mib), os.cpu_count() or 1)

    def tree_mib(self, pids: Iterable[int]) -> int:
        wanted = set(pids)
        return sum(mib for pid, mib in self._holders() if pid in wanted)


def make_host_probe(state_dir: Path | None = None) -> HostProbe:
    """SimHost when the GPUs are simulated and ORCH_SIM_HOST sizes the host; else the machine."""
    spec = os.environ.get("ORCH_SIM_HOST", "").strip()
    simulated = (os.environ.get("ORCH_GPU_BACKEND") or "").strip().lower() == "sim"
    directory = state_dir or (Path(os.environ["ORCH_SIM_DIR"]) if os.environ.get("ORCH_SIM_DIR") else None)
    if simulated and spec and directory is not None:
        from orchestrator.errors import UsageError
        from orchestrator.gpu.sim_files import parse_sizes_mib

        try:
            (total_mib,) = parse_sizes_mib(spec)
        except ValueError:
            raise UsageError(f"invalid ORCH_SIM_HOST {spec!r}: expected a size such as '32GiB'") from None
        return SimHost(directory, total_mib)
    return RealHost()


def sim_topology(count: int) -> dict[tuple[int, int], int]:
    """Simulated cards sit in pairs on one switch (0-1, 2-3, ...): close within a pair."""
    return {(i, j): (10 if i // 2 == j // 2 else 40) for i in range(count) for j in range(i + 1, count)}
