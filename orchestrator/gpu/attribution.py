"""Which GPU memory belongs to which attempt: the memory of its process tree."""

from __future__ import annotations

import psutil

from orchestrator.gpu.snapshot import GpuSnapshot


def process_tree_pids(pid: int) -> frozenset[int]:
    """`pid` and all its live descendants; empty when `pid` is gone."""
    try:
        root = psutil.Process(pid)
        children = root.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return frozenset()
    return frozenset([pid, *(child.pid for child in children)])


def tree_memory_mib(snapshot: GpuSnapshot, root_pid: int) -> int:
    """MiB that `root_pid`'s process tree holds on the GPU of `snapshot`."""
    return snapshot.memory_of(process_tree_pids(root_pid))
