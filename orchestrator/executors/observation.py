"""What one look at an attempt saw (the Executor's observe() answer), and the launch grace."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LAUNCH_GRACE_S = 60.0  # from the attempt row to pid.json; python start-up on a loaded box is slow


@dataclass(frozen=True)
class Observation:
    pid_record: dict[str, Any] | None
    exit_record: dict[str, Any] | None
    process_alive: bool
    last_progress: dict[str, Any] | None
    last_progress_at: float | None
    now_s: float
    started_alive: bool | None = None  # the executor's word while pid.json is missing (a tmux pane); None: unknown
    last_output_at: float | None = None  # stdout.log's mtime: any output is a sign of life
    # The wrapper the launcher started (attempts.pid + proc_create_time, which orch itself
    # recorded) is still running; None when the row has no such record (an adopted attempt).
    launcher_alive: bool | None = None
    pid_file_present: bool = False  # something named pid.json exists, valid or not
    problems: tuple[str, ...] = ()  # what in the run dir was refused, for the attempt's reason
    # How long the daemon has watched the attempt without a sign of life (a new progress line,
    # stdout.log growing, pid.json appearing), on its monotonic clock: never wall time against
    # file times, which a clock step (NTP, `date -s`, a VM resume) moves by hours. None: not
    # watched across passes yet, so no silence is known.
    silent_s: float | None = None
