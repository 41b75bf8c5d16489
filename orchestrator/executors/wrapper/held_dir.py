"""The wrapper's handle on its attempt's run dir: opened once, written through, never by path.

The worker runs as the same user and may replace its own run dir with a symlink to a folder
elsewhere. Every file the wrapper writes (pid.json, exit.json, gpu_peak.json, stdout.log) is
therefore created relative to a descriptor of the run dir, which was reached one O_NOFOLLOW
level at a time (runtree) before the worker started. Before each record is written the
descriptor is checked to still be the directory at the run dir's path: a dir moved away (it
could have been moved out of the runs tree) gets no record; the daemon then judges the
attempt without one, as it does any attempt whose files are missing.
Standard library and orch's stdlib-only modules: the wrapper starts before site-packages.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

from orchestrator.executors.runs_tree import exists, open_attempt_levels
from orchestrator.rundir_files import json_bytes, write_in_dir

_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


class RunDirMoved(OSError):
    """The run dir's path no longer leads to the directory the wrapper holds."""


class HeldRunDir:
    """A descriptor of one run dir, kept for the wrapper's life; writes go through it only."""

    def __init__(self, run_dir: Path, *, create: bool = False) -> None:
        self.path = Path(run_dir)
        self._fd = open_attempt_levels(self.path, create=create)
        info = os.fstat(self._fd)
        self._identity = (info.st_dev, info.st_ino)
        self._lock = threading.Lock()  # the GPU peak sampler writes from its own thread

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> HeldRunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def in_place(self) -> bool:
        """Whether the run dir's path still leads, without a link, to the directory we hold."""
        try:
            fd = open_attempt_levels(self.path, create=False)
        except OSError:
            return False
        try:
            info = os.fstat(fd)
            return (info.st_dev, info.st_ino) == self._identity
        finally:
            os.close(fd)

    def has(self, name: str) -> bool:
        """Whether anything (a symlink too) has that name in the held dir."""
        with self._lock:
            return self._fd >= 0 and exists(self._fd, name)

    def write_json(self, name: str, payload: Any, *, exclusive: bool = False) -> bool:
        """`payload` written atomically as `name` in the held dir (rundir_files.write_in_dir).
        Raises RunDirMoved when the dir is no longer at its path (nothing is written)."""
        with self._lock:
            if self._fd < 0 or not self.in_place():
                raise RunDirMoved(f"{self.path} was replaced or moved; {name} not written")
            return write_in_dir(self._fd, name, json_bytes(payload), exclusive=exclusive)

    def open_append(self, name: str) -> int:
        """A descriptor appending to `name` in the held dir; a symlink there is refused (ELOOP)."""
        with self._lock:
            return os.open(name, _APPEND_FLAGS, 0o600, dir_fd=self._fd)


def write_quietly(held: HeldRunDir, name: str, payload: Any) -> bool:
    """write_json for records whose loss the daemon survives: False instead of an error."""
    with contextlib.suppress(OSError):
        return held.write_json(name, payload)
    return False
