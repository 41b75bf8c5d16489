"""What the daemon reads of its live attempts, kept between passes while it has not changed.

A pass looks at every running attempt, so at 64 running its cost is mostly reading the same
pid.json and asking /proc about the same processes again. Here:
- a run dir's files are read again (through `attempts.rundir_reads`, the validating reader) only when the
  lstat signature of pid.json, exit.json or progress.jsonl changed; the signature only says
  *whether* to read, never *what*: every value still comes from the safe read. A worker that
  only appended to progress.jsonl (most passes) is read again once `max_age_s` has passed since
  the last read: its progress and the time of it are then that old, together (rates stay
  right), and the caller keeps `max_age_s` well under its hang timeout;
- a process proven to be the recorded one (pid and create time) is then held by a pidfd, and
  is alive while that pidfd is not readable: one poll instead of several /proc reads, and a
  reused pid can never pass for it.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from orchestrator.attempts import rundir_reads as runfiles
from orchestrator.rundir_files import RunDir

MAX_PIDFDS = 512  # processes held at once; beyond, they are checked through /proc as before
FileSig = tuple[int, int, int, int]  # inode, size, mtime (ns), mode
Signature = tuple[FileSig | None, ...]


def _stat(path: str) -> FileSig | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns, info.st_mode


def signature(run_dir: Path) -> Signature:
    base = os.fspath(run_dir)
    return tuple(_stat(os.path.join(base, name)) for name in (RunDir.PID, RunDir.EXIT, RunDir.PROGRESS))


def _ended(fd: int) -> bool:
    """A pidfd is readable once its process has ended."""
    try:
        ready, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)


def _appended(before: FileSig | None, now: FileSig | None) -> bool:
    """The same regular file, grown (or rewritten in place): nothing else in it to check."""
    return (before is not None and now is not None and before[0] == now[0] and before[3] == now[3]
            and stat.S_ISREG(now[3]) and now[1] >= before[1])


class ObserveCache:
    def __init__(self, monotonic_s: Callable[[], float] = time.monotonic) -> None:
        self._monotonic_s = monotonic_s  # the daemon's clock: when appended progress is read again
        # run dir -> (signature, files, read at, signature taken at), monotonic times
        self._files: dict[str, tuple[Signature, runfiles.RunFiles, float, float]] = {}
        self._pidfds: dict[tuple[int, float], int] = {}
        self._touched: set[tuple[int, float]] = set()

    def run_files(self, run_dir: Path, max_age_s: float = 0.0, settled: bool = False) -> runfiles.RunFiles:
        """`settled`: the attempt's wrapper, proven at launch, is alive now (its pidfd says so),
        so once it has recorded itself its exit record cannot be final yet: what was read then
        stands, unlooked-at, for up to `max_age_s` (a record that changes meanwhile, pid.json
        rewritten, is seen that late)."""
        key = os.fspath(run_dir)
        cached = self._files.get(key)
        now = self._monotonic_s()
        if (settled and cached is not None and cached[1].pid_record is not None and cached[1].exit_record is None
                and now - cached[3] < max_age_s):
            return cached[1]
        sig = signature(run_dir)
        if cached is not None:
            before, files, read_at, _ = cached
            if before == sig:
                self._files[key] = (sig, files, read_at, now)
                return files
            if before[:2] == sig[:2] and _appended(before[2], sig[2]):
                if now - read_at < max_age_s:
                    self._files[key] = (before, files, read_at, now)  # the signature of what was read
                    return files  # only new progress lines: read at the next refresh
                files = runfiles.read_progress(run_dir, files)  # pid.json and exit.json as they were
                self._files[key] = (sig, files, now, now)
                return files
        files = runfiles.read_run_files(run_dir)
        self._files[key] = (sig, files, now, now)
        return files

    def process_matches(self, pid: int, create_time: float | None, check: Callable[[int, float | None], bool]) -> bool:
        """`check(pid, create_time)` (reconcile.process_matches) once; afterwards the pidfd."""
        if isinstance(pid, bool) or not isinstance(pid, int) or create_time is None:
            return check(pid, create_time)
        key = (pid, float(create_time))
        self._touched.add(key)
        fd = self._pidfds.get(key)
        if fd is not None:
            if not _ended(fd):
                return True
            self._close(key)
            return False
        if len(self._pidfds) >= MAX_PIDFDS:
            return check(pid, create_time)
        try:
            fd = os.pidfd_open(pid)  # before the check: the fd then names the process checked
        except (OSError, AttributeError):
            return check(pid, create_time)
        if not check(pid, create_time) or _ended(fd):
            os.close(fd)
            return False
        self._pidfds[key] = fd
        return True

    def end_pass(self, live_run_dirs: Iterable[str]) -> None:
        """After a pass over every live attempt: forget what belongs to attempts gone."""
        keep = set(live_run_dirs)
        self._files = {k: v for k, v in self._files.items() if k in keep}
        for key in [k for k in self._pidfds if k not in self._touched]:
            self._close(key)
        self._touched = set()

    def close(self) -> None:
        for key in list(self._pidfds):
            self._close(key)
        self._files = {}

    def _close(self, key: tuple[int, float]) -> None:
        fd = self._pidfds.pop(key, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
