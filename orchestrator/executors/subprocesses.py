"""The subprocess executor: the wrapper as a detached child, for machines without tmux.

The wrapper gets a session of its own (so the daemon's Ctrl-C never reaches it) and writes the
log itself; there is no window, so there is no executor id and nothing to attach to.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from orchestrator.errors import LauncherError, OrchShortOf, is_orch_shortage
from orchestrator.executors.base import LaunchHandle, LaunchSpec, LocalExecutor
from orchestrator.executors.wrapper.run import wrapper_argv
from orchestrator.store.rows import Attempt


class SubprocessExecutor(LocalExecutor):
    name = "subprocess"

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def _reap(self) -> None:
        """Collect exited wrappers so they do not linger as zombies of the daemon."""
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                self._children.pop(pid, None)  # launches may run in several threads

    def submit(self, spec: LaunchSpec) -> LaunchHandle:
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
            kind = OrchShortOf if is_orch_shortage(exc) else LauncherError
            raise kind(f"cannot start job {spec.job_id}: {exc}") from None
        self._children[child.pid] = child
        return LaunchHandle(executor=self.name, pid=child.pid)

    def cleanup(self, attempts: Sequence[Attempt]) -> None:
        self._reap()
