"""What the CLI needs to know about a daemon without loading the scheduler: where its lock,
run dirs, simulated GPUs and tmux socket are (whether it is alive: orchestrator.actions.presence)."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path
from typing import IO

from orchestrator.errors import DaemonError


def lock_path(db_path: Path) -> Path:
    """Beside the resolved state.db: every path to one database (a symlink, a relative path)
    takes the same lock. (A hard link is caught by the daemon row check at registration.)"""
    return Path(str(Path(db_path).resolve()) + ".daemon.lock")


def runs_dir(db_path: Path) -> Path:
    return Path(db_path).resolve().parent / "runs"


def sim_dir(db_path: Path) -> Path:
    return Path(str(Path(db_path).resolve()) + ".sim")


def tmux_socket_name(db_path: Path) -> str:
    """One private tmux server per state.db."""
    digest = hashlib.sha256(str(Path(db_path).resolve()).encode()).hexdigest()[:10]
    return f"orch-{os.getuid()}-{digest}"


class DaemonLock:
    """An exclusive flock on `<db>.daemon.lock`; the kernel drops it when the process dies."""

    def __init__(self, db_path: Path) -> None:
        self.path = lock_path(db_path)
        self.db_path = Path(db_path)
        self._handle: IO[str] | None = None
        self._db_handle: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        handle = os.fdopen(fd, "r+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = handle.read().strip() or "another process"
            handle.close()
            raise DaemonError(
                f"a daemon is already running for this state.db (pid {holder}); "
                "`orch daemon status` shows it, `orch daemon stop` stops it"
            ) from None
        try:
            self._db_handle = _lock_database_file(self.db_path)  # the same file by another name
        except BaseException:
            handle.close()
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._handle = handle

    def fileno(self) -> int | None:
        """The held lock file's descriptor (database_file.leave_note writes through it)."""
        return self._handle.fileno() if self._handle is not None else None

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._db_handle is not None:
            os.close(self._db_handle)
            self._db_handle = None

    @staticmethod
    def is_held(db_path: Path) -> bool:
        # Only the lock file: opening and closing state.db here would drop every fcntl lock this
        # process's SQLite connections hold on it (POSIX locks are per process, not per fd), and
        # a connection that lost them read a stale snapshot for good. A daemon on a hard link
        # is refused by its own flock on state.db, and by the daemon row check at registration.
        path = lock_path(db_path)
        if not path.exists():
            return False
        with open(path) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False


def _lock_database_file(db_path: Path) -> int:
    """An exclusive flock on state.db itself, which every path to it shares (a symlink, a
    hard link, a relative path). SQLite locks with fcntl, which flock does not touch on Linux."""
    fd = os.open(db_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DaemonError(
            f"a daemon is already running for {db_path}; `orch daemon status` shows it, `orch daemon stop` stops it"
        ) from None
    return fd
