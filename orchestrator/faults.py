"""Fault injection for crash-recovery tests: `ORCH_FAULT_POINT=NAME`, read once by the daemon
when it starts, makes the process exit at once (no clean-up, no commit, as a kill would) the
first time it reaches the point named NAME. Points: `after_learn` (an attempt's end: memory
learned, the attempt not yet closed), `after_mark_hung` (a silent attempt marked hung, not yet
killed), `mid_launch_batch` (a batch's tmux windows opened, their attempts not yet recorded),
`after_trial_queued` (a TPE search's new trial queued, nothing else done)."""

from __future__ import annotations

import os

FAULT_EXIT_CODE = 86
_armed: str | None = None


def arm_from_env() -> None:
    global _armed
    _armed = os.environ.get("ORCH_FAULT_POINT") or None


def reach(point: str) -> None:
    if _armed is not None and _armed == point:
        os.write(2, f"fault point {point} reached: exiting\n".encode())
        os._exit(FAULT_EXIT_CODE)
