"""One process's /proc/<pid>/stat, read once: its state, parent and start.

psutil reads the same file (often several times, and /proc/stat for the boot time on each
create_time) behind its Process object; the paths that ask every second for many processes
(the simulated GPUs' holders, a wrapper's GPU peak sampler) read it here once per question.
No psutil import: the wrapper uses this before its worker starts. Linux only; callers fall
back to psutil where None comes back.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

HAVE_PROC = os.path.isdir("/proc/self")


class ProcStat(NamedTuple):
    state: str  # "R", "S", "Z" (zombie), ...
    ppid: int
    start_ticks: int  # clock ticks after boot
    cpu_ticks: int  # user + system time, in clock ticks
    rss_pages: int  # resident set size, as psutil's memory_info().rss / page size


def read_stat(pid: int | str) -> ProcStat | None:
    """`pid`'s stat ("self" for this process); None when it is gone or there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # after the name (which may hold spaces and ')'), fields count from 3 (state)
            fields = stat.read().rsplit(b")", 1)[1].split()
        return ProcStat(fields[0].decode("ascii", "replace"), int(fields[1]), int(fields[19]),
                        int(fields[11]) + int(fields[12]), int(fields[21]))
    except (OSError, ValueError, IndexError):
        return None


def cpu_seconds(stat: ProcStat) -> float:
    return stat.cpu_ticks / os.sysconf("SC_CLK_TCK")


def rss_bytes(stat: ProcStat) -> int:
    return stat.rss_pages * os.sysconf("SC_PAGE_SIZE")


@functools.lru_cache(maxsize=1)
def boot_time_s() -> float | None:
    try:
        with open("/proc/stat", "rb") as host:
            return float(next(int(line.split()[1]) for line in host if line.startswith(b"btime ")))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def create_time_s(stat: ProcStat) -> float | None:
    """The process's start as psutil's create_time gives it (boot time + start ticks)."""
    boot_s = boot_time_s()
    return None if boot_s is None else boot_s + stat.start_ticks / os.sysconf("SC_CLK_TCK")
