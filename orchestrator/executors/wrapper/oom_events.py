"""The kernel's OOM kills in an attempt's cgroup v2 folder, as its wrapper reads them.

`memory.events` counts, hierarchically, the processes of the cgroup the kernel's OOM killer
ended (`oom_kill N`), whether the whole host or a memory limit ran out. The wrapper reads the
count when it starts and after its worker exits; a rise is the kernel's word that a process of
this attempt was OOM-killed, which a bare SIGKILL (an admin, a watchdog) does not give.
"""

from __future__ import annotations

import os

MEMORY_EVENTS = "memory.events"
MAX_EVENTS_BYTES = 4096  # a handful of "name count" lines


def oom_kill_count(memory_events: str) -> int | None:
    """The `oom_kill` count of a memory.events text; None when the text has no such line."""
    for line in memory_events.splitlines():
        name, _, value = line.strip().partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value.strip())
    return None


def read_oom_kill_count(folder: str) -> int | None:
    """The `oom_kill` count of the cgroup `folder`; None where it cannot be read (no memory
    controller there, no such folder, a link)."""
    if not folder:
        return None
    try:
        fd = os.open(os.path.join(folder, MEMORY_EVENTS), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return oom_kill_count(os.read(fd, MAX_EVENTS_BYTES).decode("ascii", errors="replace"))
    except OSError:
        return None
    finally:
        os.close(fd)


def oom_kills_since(before: int | None, after: int | None) -> int | None:
    """Kills between two readings; None unless both were read."""
    if before is None or after is None:
        return None
    return max(0, after - before)
