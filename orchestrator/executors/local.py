"""tmux and subprocess executors: the local launchers behind the executor seam.

Liveness stays with the run dir and the local process checks in reconcile (poll has nothing to
add); a finished attempt's tmux window is closed once its end is recorded (its output is in the
run dir's stdout.log), so windows of finished attempts do not pile up.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path

from orchestrator.executors.base import NotAttachable, RemoteStatus, log_path
from orchestrator.executors.process_groups import Launcher, LaunchHandle, LaunchSpec
from orchestrator.store.rows import Attempt, Job

log = logging.getLogger(__name__)


class LocalExecutor:
    remote = False

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self.name = launcher.name
        batch = getattr(launcher, "launch_many", None)
        if batch is not None:  # a launcher that starts a pass's attempts in one call keeps doing so
            self.launch_many = batch

    def launch(self, spec: LaunchSpec) -> LaunchHandle:
        return self.launcher.launch(spec)

    def poll(self, attempts: Sequence[tuple[Attempt, Job]]) -> dict[int, RemoteStatus] | None:
        return {}

    def cancel(self, attempt: Attempt, job: Job) -> None:
        """Local attempts are stopped by their process group (the daemon's kill path)."""

    def cleanup(self, attempts: Sequence[Attempt]) -> None:
        window_ids = [str(a.window_id) for a in attempts if a.window_id and a.launcher == self.name]
        if not window_ids:
            return
        try:
            many = getattr(self.launcher, "kill_windows", None)
            if many is not None:  # one call for the pass's ended attempts
                many(window_ids)
            else:
                for window_id in window_ids:
                    self.launcher.kill_window(window_id)
        except Exception:  # a window we cannot close is only clutter
            log.warning("cannot close windows %s", ", ".join(window_ids), exc_info=True)

    def logs(self, attempt: Attempt) -> Path:
        return log_path(attempt)

    def attach(self, attempt: Attempt) -> list[str]:
        window_id = attempt.executor_id or attempt.window_id
        argv = self.launcher.attach_command(str(window_id)) if window_id else []
        if not argv:
            raise NotAttachable(f"attempt {attempt.id} has no window here ({self.name} executor): use `orch logs`")
        return argv

    def window_alive(self, handle_window_id: str) -> bool:
        return self.launcher.window_alive(handle_window_id)

    def kill_window(self, window_id: str) -> None:
        self.launcher.kill_window(window_id)

    def attach_command(self, window_id: str) -> list[str]:
        return self.launcher.attach_command(window_id)

    def kill_server(self) -> None:
        close = getattr(self.launcher, "kill_server", None)
        if callable(close):
            with contextlib.suppress(Exception):
                close()
