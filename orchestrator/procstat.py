"""One process's /proc/<pid>/stat, read once: its state, parent and start.

psutil reads the same file (often several times, and /proc/stat for the boot time on each
create_time) behind its Process object; the paths that ask every second for many processes
(the simulated GPUs' holders, a wrapper's GPU peak sampler) read it here once per question.
No psutil import: the wrapper uses this before its worker starts. Linux only; callers fall
back to psutil where None comes back. It also holds the one answer to "is this pid still the
process we recorded" (process_matches).
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


# "Is this pid still the process we recorded" has one answer, here: the same pid with a start
# within this of the recorded one. Each start is read as the boot time (whole seconds in
# /proc/stat, which can move by one as the kernel's clock is adjusted, and is read once per
# process) plus the start ticks, by different processes at different times (the wrapper into
# pid.json, the daemon, a simulated GPU's holder); so two readings of one process can differ by
# up to a second. A pid handed to a new process within that second is what it cannot tell
# apart: pids are given out in increasing order, so that needs the whole pid range used up in
# one second.
SAME_PROCESS_TOLERANCE_S = 1.0


def same_start(created_s: float, recorded_s: float) -> bool:
    """Whether two readings of a process's start are readings of one start."""
    return abs(created_s - recorded_s) <= SAME_PROCESS_TOLERANCE_S


def process_start(pid: int) -> tuple[float, bool] | None:
    """(`pid`'s start as psutil's create_time gives it, whether it is a zombie); None when there
    is no such process or /proc cannot say (orch runs on Linux)."""
    stat = read_stat(pid) if pid > 0 else None
    created_s = create_time_s(stat) if stat is not None else None
    return None if stat is None or created_s is None else (created_s, stat.state == "Z")


def process_matches(pid: object, recorded_s: object) -> bool:
    """True when `pid` runs (not a zombie) and is the very process whose start was recorded as
    `recorded_s`, not a later process given the same pid. Values from files are checked here."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    if isinstance(recorded_s, bool) or not isinstance(recorded_s, (int, float)):
        return False
    start = process_start(pid)
    return start is not None and not start[1] and same_start(start[0], float(recorded_s))
