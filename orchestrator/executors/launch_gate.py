"""The launch gate of a tmux batch: a FIFO in the runs dir that holds a batch's panes until every
window of it is open."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from orchestrator.executors.wake import RUN_DIR_DEPTH, wake_path

GATE_FILE = ".launch-gate"  # in the runs dir, beside the wake FIFO
LAUNCH_FILE_PREFIX, LAUNCH_FILE_SUFFIX = ".launch-", ".conf"  # a batch's tmux commands, there too


def launch_file(runs_dir: Path | None) -> tuple[int, str]:
    """A new private (0600, O_EXCL) file for a batch's tmux commands: in the runs dir when
    there is one, else in the temp folder."""
    if runs_dir is not None:
        try:
            return tempfile.mkstemp(prefix=LAUNCH_FILE_PREFIX, suffix=LAUNCH_FILE_SUFFIX, dir=runs_dir)
        except OSError:
            pass  # not writable now: the temp folder, as before
    return tempfile.mkstemp(prefix="orch-launch-", suffix=LAUNCH_FILE_SUFFIX)


def sweep_launch_files(runs_dir: Path) -> int:
    """Remove the launch files a killed daemon left in the runs dir (one daemon per database,
    so none is in use when the next one starts); how many."""
    removed = 0
    with contextlib.suppress(OSError):
        for path in runs_dir.glob(LAUNCH_FILE_PREFIX + "*" + LAUNCH_FILE_SUFFIX):
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(path).st_mode):
                    path.unlink()
                    removed += 1
    return removed


class LaunchGate:
    """Holds the panes of one batch until every window of it is open.

    tmux opens a batch's windows one after another, and each pane starts its interpreter at
    once: on a busy machine 64 interpreters starting side by side slowed the batch from 0.2
    to 2 s, and the pass that launched it. So each pane of a batch first opens a FIFO in the
    runs dir for reading, which blocks while no writer holds it; the daemon holds it (read and
    write: never blocks) except while it opens a batch. A daemon that dies with the gate shut
    leaves those panes waiting until the next daemon opens it; their wrappers then find the
    attempt declared lost, and start nothing. A missing or replaced gate holds nothing back.
    """

    def __init__(self) -> None:
        self.path: Path | None = None
        self._fd: int | None = None

    @staticmethod
    def runs_dir(run_dir: Path) -> Path | None:
        """The runs dir above an attempt's run dir, when a daemon set it up (its wake FIFO is there)."""
        if len(run_dir.parts) <= RUN_DIR_DEPTH:
            return None
        runs_dir = run_dir.parents[RUN_DIR_DEPTH - 1]
        try:
            return runs_dir if stat.S_ISFIFO(os.lstat(wake_path(runs_dir)).st_mode) else None
        except OSError:
            return None

    def shut(self, run_dir: Path) -> Path | None:
        """Stop holding the gate (new readers now wait); its path, None when there is none."""
        if len(run_dir.parts) <= RUN_DIR_DEPTH:
            return None
        runs_dir = run_dir.parents[RUN_DIR_DEPTH - 1]
        try:  # only in a runs dir a daemon has set up: its wake FIFO is there
            if not stat.S_ISFIFO(os.lstat(wake_path(runs_dir)).st_mode):
                return None
        except OSError:
            return None
        path = runs_dir / GATE_FILE
        try:
            os.mkfifo(path, 0o600)
        except FileExistsError:
            pass
        except OSError:
            return None
        try:
            if not stat.S_ISFIFO(os.lstat(path).st_mode):
                return None
        except OSError:
            return None
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        self.path = path
        return path

    def release(self) -> None:
        """Hold the gate again: every pane waiting on it goes on."""
        if self.path is None or self._fd is not None:
            return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            self._fd = fd
        else:
            os.close(fd)
