"""state.db as a file that can vanish, be replaced or turn read-only under a running daemon.

The daemon keeps state.db open (its SQLite connection and a flock on the file). Removed (`rm
state.db`) or replaced, the daemon would run on on a file nobody else can reach while every
new command opens a fresh one. So the daemon compares the file at the path with the one it
opened (device and inode) every pass and stops when they differ, leaving a line in its lock
file; the CLI reads that line, and finds a daemon still running on a removed file by its
lock and /proc/<pid>/fd, so it can say what happened and `orch daemon stop` can stop it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
from pathlib import Path

from orchestrator.daemon.state import lock_path

GONE_PREFIX = "stopped: "  # a lock file's text after its daemon stopped for its database's sake


def file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path` now; None when there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def what_became_of(db_path: Path, opened: tuple[int, int]) -> str | None:
    """Why the daemon that opened `opened` must stop, in one line; None while the file at
    `db_path` is still the one it opened."""
    now = file_identity(db_path)
    if now == opened:
        return None
    how = "removed" if now is None else "replaced by another file"
    return f"state database {db_path} was {how} while the daemon ran"


def leave_note(handle_fd: int, text: str) -> None:
    """Write why the daemon stopped into its (still held) lock file, for the CLI to tell."""
    stamp = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S")
    with contextlib.suppress(OSError):
        os.ftruncate(handle_fd, 0)
        os.pwrite(handle_fd, f"{GONE_PREFIX}{stamp}: {text}\n".encode(), 0)


def last_note(db_path: Path) -> str | None:
    """What the last daemon of this database said when it stopped for the file's sake."""
    with contextlib.suppress(OSError), open(lock_path(db_path), encoding="utf-8", errors="replace") as handle:
        text = handle.read(4096).strip()
        if text.startswith(GONE_PREFIX):
            return text[len(GONE_PREFIX):]
    return None


def lock_holder(db_path: Path) -> int | None:
    """The pid of the live process holding the database's daemon lock: the pid written in the
    lock file, taken only when that process has the lock file open (/proc/<pid>/fd)."""
    path = lock_path(db_path)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                text = handle.read(64).strip()
            else:
                fcntl.flock(handle, fcntl.LOCK_UN)
                return None  # nobody holds it
    except OSError:
        return None
    if not text.isdigit():
        return None
    pid = int(text)
    return pid if _holds_open(pid, path) is not None else None


def _holds_open(pid: int, path: Path, deleted: bool = False) -> str | None:
    """The fd link of `pid` naming `path` (with ' (deleted)' when asked for that); None if none."""
    wanted = str(path) + (" (deleted)" if deleted else "")
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == wanted:
                    return fd
    return None


def daemon_on_lost_file(db_path: Path) -> tuple[int, str] | None:
    """(pid, one line) when a daemon of this database still runs on a state.db that was
    removed or replaced; None otherwise."""
    pid = lock_holder(db_path)
    if pid is None:
        return None
    db = Path(str(Path(db_path).resolve()))
    if _holds_open(pid, db, deleted=True) is not None:
        how = "removed"
    else:
        fd = _holds_open(pid, db)
        if fd is None:
            return None
        try:
            held = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            return None
        if (held.st_dev, held.st_ino) == file_identity(db):
            return None  # the very file: all is well
        how = "replaced by another file"
    return pid, (
        f"state database {db_path} was {how} while its daemon (pid {pid}) ran on it; the daemon stops "
        "by itself at its next pass, `orch daemon stop` stops it now"
    )
