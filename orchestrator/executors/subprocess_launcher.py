"""Subprocess launcher: the wrapper as a detached child, for machines without tmux.

The wrapper gets a session of its own (so the daemon's Ctrl-C never reaches it) and writes the
log itself; there is no window, so `window_id` is None and there is nothing to attach to.
"""

from __future__ import annotations

import os
import subprocess

from orchestrator.errors import LauncherError
from orchestrator.executors.process_groups import LaunchHandle, LaunchSpec
from orchestrator.executors.wrapper.run import wrapper_argv


class SubprocessLauncher:
    name = "subprocess"

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def _reap(self) -> None:
        """Collect exited wrappers so they do not linger as zombies of the daemon."""
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                self._children.pop(pid, None)  # launches may run in several threads

    def launch(self, spec: LaunchSpec) -> LaunchHandle:
        self._reap()
        try:
            spec.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            child = subprocess.Popen(
                wrapper_argv(spec.run_dir, spec.argv),
                env={**os.environ, **spec.env},
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise LauncherError(f"cannot start job {spec.job_id}: {exc}") from None
        self._children[child.pid] = child
        return LaunchHandle(launcher=self.name, pid=child.pid, window_id=None)

    def window_alive(self, handle_window_id: str) -> bool:
        return False  # no windows: liveness comes from pid.json

    def kill_window(self, window_id: str) -> None:
        self._reap()

    def attach_command(self, window_id: str) -> list[str]:
        return []
