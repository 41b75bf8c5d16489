"""The kernel log's word on OOM kills: which pids its OOM killer ended, and since when.

`parse_oom_kills` is pure (records as /dev/kmsg gives them: `priority,sequence,microseconds
since boot,flags;message`); `read_kernel_log` reads /dev/kmsg where this process may (root, or
kernel.dmesg_restrict = 0) and gives None elsewhere, so the evidence is used where readable and
never guessed at where not.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterable

KMSG = "/dev/kmsg"
MAX_RECORDS = 20_000  # the ring buffer holds a few thousand; never read without end
MAX_RECORD_BYTES = 8192
# "Out of memory: Killed process 1234 (python)", "Memory cgroup out of memory: Killed process 1234 (python)"
_KILLED = re.compile(r"out of memory: Kill(?:ed)? process (\d+)\b", re.I)
# "oom-kill:constraint=CONSTRAINT_NONE,...,task=python,pid=1234,uid=0"
_OOM_KILL = re.compile(r"\boom-kill:.*?\bpid=(\d+)\b")


def parse_oom_kills(records: Iterable[str], since_boot_s: float | None = None) -> set[int]:
    """Pids the kernel's OOM killer ended in `records`, at or after `since_boot_s` (seconds
    since boot; None: any time)."""
    killed: set[int] = set()
    for record in records:
        header, _, message = record.partition(";")
        fields = header.split(",")
        stamped = len(fields) >= 3 and fields[2].isdigit()
        if since_boot_s is not None and stamped and int(fields[2]) / 1e6 < since_boot_s:
            continue
        for pattern in (_KILLED, _OOM_KILL):
            match = pattern.search(message)
            if match is not None:
                killed.add(int(match.group(1)))
    return killed


def read_kernel_log() -> list[str] | None:
    """The kernel log's records; None where /dev/kmsg cannot be read."""
    try:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    records: list[str] = []
    try:
        while len(records) < MAX_RECORDS:
            try:
                chunk = os.read(fd, MAX_RECORD_BYTES)
            except BlockingIOError:
                break  # read to the end
            except BrokenPipeError:
                continue  # records overwritten while reading: go on with the next
            except OSError:
                return records or None
            if not chunk:
                break
            records.append(chunk.decode("utf-8", errors="replace").rstrip("\n"))
    finally:
        os.close(fd)
    return records


def seconds_since_boot(epoch_s: float) -> float:
    """An epoch time as the kernel log's clock (monotonic, since boot) reads it."""
    return epoch_s - (time.time() - time.monotonic())


def kernel_oom_killed(pids: Iterable[int], started_epoch_s: float | None) -> bool:
    """Whether the readable kernel log names one of `pids` as OOM-killed since the attempt
    started (a few seconds' slack for the two clocks); False where the log cannot be read."""
    wanted = {pid for pid in pids if pid > 0}
    if not wanted:
        return False
    records = read_kernel_log()
    if records is None:
        return False
    since = None
    with contextlib.suppress(OverflowError, ValueError):
        since = None if started_epoch_s is None else seconds_since_boot(started_epoch_s) - 5.0
    return bool(parse_oom_kills(records, since) & wanted)
