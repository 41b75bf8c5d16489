"""Waking the daemon the moment an attempt ends: a FIFO in the runs dir.

The wrapper writes its run dir's path, one line, to `runs/.wake` after exit.json (`poke`);
the daemon waits on the FIFO between passes instead of sleeping (`WakeChannel.wait`), so a
freed slot is seen at once, not at the next tick. Everything here may fail without harm: a
poke that finds no daemon (no reader: ENXIO), a full pipe, a missing or replaced FIFO all
leave the attempt to the daemon's periodic pass, which reads exit.json as before.

Only this user can write to the FIFO (0600, in the 0700 runs dir), but user code runs as
this user, so a line is only ever a hint: the daemon looks it up among its own live
attempts' run dirs and ignores anything else.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from orchestrator.procstat import process_matches

WAKE_FILE = ".wake"
RUN_DIR_DEPTH = 3  # runs/<suite>/<job>/attempt-N (executors.runs_tree)
MAX_LINE_BYTES = 4096  # PIPE_BUF: a write up to this size is never interleaved with another
MAX_READ_BYTES = 1 << 16  # lines read per wake-up; more waits for the next pass


def wake_path(runs_dir: Path) -> Path:
    return Path(runs_dir) / WAKE_FILE


def poke(run_dir: Path) -> bool:
    """Tell a waiting daemon that the attempt in `run_dir` has ended; False when no daemon
    heard it (none running, a full pipe, no FIFO). Never raises, never blocks."""
    run_dir = Path(run_dir)
    if len(run_dir.parts) <= RUN_DIR_DEPTH:
        return False
    line = os.fsencode(str(run_dir)) + b"\n"
    if len(line) > MAX_LINE_BYTES or b"\n" in line[:-1]:
        return False
    try:
        # NONBLOCK: no reader is ENXIO, a full pipe EAGAIN; NOFOLLOW: never through a link
        fd = os.open(
            wake_path(run_dir.parents[RUN_DIR_DEPTH - 1]),
            os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC,
        )
    except OSError:
        return False
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False  # something else took the name: write nothing into it
        return os.write(fd, line) == len(line)
    except OSError:
        return False
    finally:
        os.close(fd)


class WakeChannel:
    """The daemon's end of the FIFO: created (or taken over) at start, read between passes."""

    def __init__(self, runs_dir: Path) -> None:
        self.path = wake_path(runs_dir)
        self._read_fd: int | None = None
        self._keep_fd: int | None = None  # our own writer: no EOF storm while no wrapper writes
        self._pending = b""

    def open(self) -> bool:
        """Make the FIFO and open it; False (and the daemon ticks as before) when it cannot."""
        try:
            info = os.lstat(self.path)
            if not stat.S_ISFIFO(info.st_mode) or info.st_uid != os.geteuid():
                os.unlink(self.path)  # not ours, or not a FIFO: never read from it
                raise FileNotFoundError(errno.ENOENT, "replaced", str(self.path))
        except FileNotFoundError:
            try:
                os.mkfifo(self.path, 0o600)
            except OSError:
                return False
        except OSError:
            return False
        try:
            self._read_fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
            self._keep_fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            self.close()
            return False
        return True

    @property
    def active(self) -> bool:
        return self._read_fd is not None

    def wait(self, timeout_s: float) -> set[Path]:
        """Block up to `timeout_s` for pokes; the run dirs named (an empty set on timeout, or
        when the channel is not open: then it just sleeps)."""
        import select

        if self._read_fd is None:
            if timeout_s > 0:
                select.select([], [], [], timeout_s)
            return set()
        try:
            ready, _, _ = select.select([self._read_fd], [], [], max(0.0, timeout_s))
        except (OSError, ValueError):
            return set()
        return self.drain() if ready else set()

    def drain(self) -> set[Path]:
        """The run dirs poked since the last read, without waiting."""
        if self._read_fd is None:
            return set()
        data = self._pending
        with contextlib.suppress(BlockingIOError, OSError):
            data += os.read(self._read_fd, MAX_READ_BYTES)
        lines = data.split(b"\n")
        self._pending = lines.pop()[-MAX_LINE_BYTES:]  # a line cut by the read size
        return {Path(os.fsdecode(line)) for line in lines if line and len(line) < MAX_LINE_BYTES}

    def close(self) -> None:
        for fd in (self._read_fd, self._keep_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._read_fd = self._keep_fd = None


def wait_gone(pid: int, create_time: float, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for the process `pid` created at `create_time` to end (a poke
    comes from a wrapper that is still exiting); True once it is gone. A pid reused by another
    process counts as gone; the caller proves group membership itself before any signal."""
    import select

    import psutil

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (OSError, AttributeError):  # no pidfd here: poll instead
        fd = None
    try:
        if not process_matches(pid, create_time):
            return True  # ended, a zombie, or its pid reused by another process
        try:
            if fd is None:
                psutil.Process(pid).wait(timeout_s)
                return True
        except psutil.NoSuchProcess:
            return True
        except (psutil.TimeoutExpired, psutil.AccessDenied):
            return False
        ready, _, _ = select.select([fd], [], [], timeout_s)  # readable once the process ended
        return bool(ready)
    finally:
        if fd is not None:
            os.close(fd)
