"""A full disk holds decisions, never makes one: the daemon's disk checks."""

from __future__ import annotations

import logging
from pathlib import Path

from orchestrator.attempts.disk_space import (
    DiskState,
    disk_state,
    is_disk_full_error,
)
from orchestrator.clock import Clock
from orchestrator.daemon.settings import DaemonSettings
from orchestrator.errors import OrchError
from orchestrator.executors.runs_tree import check_runs_root
from orchestrator.store.db import Store
from orchestrator.store.jobs import add_event

log = logging.getLogger(__name__)


class DiskHold:
    """The daemon's full-disk hold: the runs dir's free space read every pass, the hold it puts
    on every queued job, and silence a full disk excuses."""

    def __init__(self, store: Store, clock: Clock, runs_dir: Path, settings: DaemonSettings) -> None:
        self.store = store
        self.clock = clock
        self.runs_dir = runs_dir
        self.settings = settings
        self.state: DiskState | None = None  # the last reading
        self._full_at_s: float | None = None  # when a write last found the disk full (monotonic)
        self._full_said = False

    @property
    def full(self) -> bool:
        return self.state is not None and self.state.full

    def hold_reason(self) -> str | None:
        """Why nothing may start now, for every queued job: a full disk, or an unsafe runs dir."""
        if self.state is not None and self.state.full:
            return self.state.wait_reason()
        try:
            check_runs_root(self.runs_dir, create=True)
        except OrchError as exc:
            return str(exc)
        return None

    def check(self) -> None:
        """Read the runs dir's free space; log and record an event when its level changes."""
        before = self.state.level if self.state is not None else "ok"
        self.state = disk = disk_state(self.runs_dir, self.settings.min_free_mib, self.settings.warn_free_mib)
        if disk.level == before:
            return
        if disk.full:
            message = disk.wait_reason()
        elif disk.low:
            message = disk.warning()
        else:
            message = f"disk space back: {disk.path} has {disk.free_mib} MiB free"
        (log.warning if disk.level != "ok" else log.info)("%s", message)
        if not disk.full:
            self._full_said = False
        try:
            with self.store.write():
                add_event(self.store, "disk", message, data=disk.to_json())
        except Exception as exc:
            if not is_disk_full_error(exc):
                raise
            self.note_full(exc)  # the event is lost; the state it tells of is in the log

    def note_full(self, exc: Exception) -> None:
        """A write refused for lack of space: said once until the disk has room again."""
        self._full_at_s = self.clock.monotonic_s()
        if not self._full_said:
            self._full_said = True
            log.warning("%s; running attempts keep running, their ends are recorded once there is room", exc)

    def silenced(self, hang_timeout_s: float) -> bool:
        """The disk was full within the hang timeout (now, or a write found it so)."""
        now = self.clock.monotonic_s()
        if self.full:
            self._full_at_s = now
        return self._full_at_s is not None and now - self._full_at_s < hang_timeout_s
