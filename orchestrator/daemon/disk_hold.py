"""A full disk holds decisions, never makes one: the daemon's disk checks."""

from __future__ import annotations

import logging

from orchestrator.attempts.disk_space import (
    DiskState,
    disk_state,
    is_disk_full_error,
)
from orchestrator.clock import Clock
from orchestrator.daemon.settings import DaemonSettings
from orchestrator.errors import OrchError
from orchestrator.executors.runs_tree import check_runs_root
from orchestrator.scheduling.dispatch import DispatchContext
from orchestrator.store.db import Store
from orchestrator.store.jobs import add_event

log = logging.getLogger(__name__)


class DiskHold:
    """The daemon's full-disk hold (mixed into Daemon): the runs dir's free space read every
    pass, the hold it puts on every queued job, and silence a full disk excuses."""

    store: Store
    clock: Clock
    ctx: DispatchContext
    settings: DaemonSettings
    disk: DiskState | None
    _disk_full_at_s: float | None
    _disk_full_said: bool

    def _hold_reason(self) -> str | None:
        """Why nothing may start now, for every queued job: a full disk, or an unsafe runs dir."""
        if self.disk is not None and self.disk.full:
            return self.disk.wait_reason()
        try:
            check_runs_root(self.ctx.runs_dir, create=True)
        except OrchError as exc:
            return str(exc)
        return None

    def _check_disk(self) -> None:
        """Read the runs dir's free space; log and record an event when its level changes."""
        before = self.disk.level if self.disk is not None else "ok"
        self.disk = disk_state(self.ctx.runs_dir, self.settings.min_free_mib, self.settings.warn_free_mib)
        if self.disk.level == before:
            return
        if self.disk.full:
            message = self.disk.wait_reason()
        elif self.disk.low:
            message = self.disk.warning()
        else:
            message = f"disk space back: {self.disk.path} has {self.disk.free_mib} MiB free"
        (log.warning if self.disk.level != "ok" else log.info)("%s", message)
        if not self.disk.full:
            self._disk_full_said = False
        try:
            with self.store.write():
                add_event(self.store, "disk", message, data=self.disk.to_json())
        except Exception as exc:
            if not is_disk_full_error(exc):
                raise
            self._note_disk_full(exc)  # the event is lost; the state it tells of is in the log

    def _note_disk_full(self, exc: Exception) -> None:
        """A write refused for lack of space: said once until the disk has room again."""
        self._disk_full_at_s = self.clock.monotonic_s()
        if not self._disk_full_said:
            self._disk_full_said = True
            log.warning("%s; running attempts keep running, their ends are recorded once there is room", exc)

    def _silenced_by_disk(self, hang_timeout_s: float) -> bool:
        """The disk was full within the hang timeout (now, or a write found it so)."""
        now = self.clock.monotonic_s()
        if self.disk is not None and self.disk.full:
            self._disk_full_at_s = now
        return self._disk_full_at_s is not None and now - self._disk_full_at_s < hang_timeout_s
