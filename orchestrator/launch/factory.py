"""Choosing the launcher: tmux when it is installed, else plain subprocesses."""

from __future__ import annotations

import logging
import os
import shutil

from orchestrator.errors import UsageError
from orchestrator.launch.base import LAUNCHERS, Launcher

log = logging.getLogger(__name__)


def make_launcher(kind: str | None, socket_name: str) -> Launcher:
    """`kind` (else env ORCH_LAUNCHER, else tmux when it is installed, else subprocess)."""
    chosen = (kind or os.environ.get("ORCH_LAUNCHER") or "").strip().lower()
    if chosen not in ("", *LAUNCHERS):
        raise UsageError(f"unknown launcher {chosen!r}: use tmux or subprocess")
    if not chosen:
        if shutil.which("tmux"):
            chosen = "tmux"
        else:
            log.warning(
                "tmux is not installed: workers run as plain subprocesses (no `orch attach`)"
            )
            chosen = "subprocess"
    if chosen == "tmux":
        from orchestrator.launch.tmux import TmuxLauncher

        return TmuxLauncher(socket_name)
    from orchestrator.launch.subprocess_launcher import SubprocessLauncher

    return SubprocessLauncher()
