"""What happened to a live attempt: read its run dir and processes, then decide (pure).

Run at daemon start and every tick. The run dir's files are the source of truth (the wrapper
writes pid.json before the worker starts and exit.json after it ends); a pid alone is never
trusted: an attempt is alive only when all agree: the process with pid.json's pid has
pid.json's create time, and the attempt row's pid (the wrapper pid the launcher returned) and
create time, where known, are pid.json's. On disagreement the attempt is lost (logged with the
reason); its pid.json group is still killed before any requeue when its leader is the very
process that wrote pid.json in our private run dir, since that process runs this job.

Claimed but never launched. `start_attempt` commits the attempt (job -> running) before the
launcher is called, and the daemon records `launcher`/`window_id`/`pid` right after the call
returns. An attempt without pid.json is judged so:
- no launcher recorded and claimed before this daemon started (`daemon_started_at_s`): the
  daemon that claimed it is dead, so no launch call of it can still return: lost at once;
- its window is gone, or its command ended, without writing pid.json: lost at once;
- otherwise (window alive, or nothing to look at) pending for up to LAUNCH_GRACE_S.
The old daemon may have died right after tmux opened the window, with the wrapper still
starting. So before any attempt without pid.json is declared lost, `mark_lost` creates the
run dir's lost marker (O_EXCL) and then looks for pid.json; the wrapper (claim_run_dir)
creates pid.json exclusively and then looks for the marker. Each writes its flag before
reading the other's, so at most one goes on: either the wrapper never starts the worker, or
the daemon sees pid.json and judges the attempt again on its next pass, as usual.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import psutil

from orchestrator.launch.wrapper import EXIT_FILE, LOG_FILE, LOST_MARKER, PID_FILE
from workers.harness import PROGRESS_FILE, RESULT_FILE, read_last_progress

log = logging.getLogger(__name__)

LAUNCH_GRACE_S = 60.0  # from the attempt row to pid.json; python start-up on a loaded box is slow
CREATE_TIME_TOLERANCE_S = 1.0


class Verdict(str, Enum):
    PENDING = "pending"  # launched, wrapper not yet recorded
    ALIVE = "alive"
    HUNG = "hung"  # alive but silent for longer than the suite's hang timeout
    FINISHED = "finished"  # exit record present
    LOST = "lost"  # no live process and no exit record


@dataclass(frozen=True)
class Observation:
    pid_record: dict[str, Any] | None
    exit_record: dict[str, Any] | None
    process_alive: bool
    last_progress: dict[str, Any] | None
    last_progress_at: float | None
    now_s: float
    window_alive: bool | None = None  # the launcher's word while pid.json is missing; None: unknown
    last_output_at: float | None = None  # stdout.log's mtime: any output is a sign of life


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError, PermissionError):
        return None
    return data if isinstance(data, dict) else None


def read_result(run_dir: Path) -> dict[str, Any] | None:
    return _read_json(Path(run_dir) / RESULT_FILE)


def read_log_tail(run_dir: Path, max_bytes: int = 16384) -> str:
    path = Path(run_dir) / LOG_FILE
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            return handle.read().decode("utf-8", errors="replace")
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        return ""


def process_matches(pid: int | None, create_time: float | None) -> bool:
    """True when `pid` runs and is the very process recorded (not a reused pid)."""
    if not pid or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if create_time is None:
            return False
        return abs(proc.create_time() - float(create_time)) <= CREATE_TIME_TOLERANCE_S
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def observe(run_dir: Path, now_s: float) -> Observation:
    run_dir = Path(run_dir)
    pid_record = _read_json(run_dir / PID_FILE)
    exit_record = _read_json(run_dir / EXIT_FILE)
    alive = False
    if pid_record is not None:
        alive = process_matches(pid_record.get("pid"), pid_record.get("create_time"))
    progress_at: float | None = None
    with contextlib.suppress(FileNotFoundError, NotADirectoryError, PermissionError):
        progress_at = (run_dir / PROGRESS_FILE).stat().st_mtime
    from orchestrator.launch.rundir import stat_output  # yaml: not for every CLI start

    output = stat_output(run_dir)
    return Observation(
        last_output_at=output.mtime_s if output is not None else None,
        pid_record=pid_record,
        exit_record=exit_record,
        process_alive=alive,
        last_progress=read_last_progress(run_dir) if progress_at is not None else None,
        last_progress_at=progress_at,
        now_s=now_s,
    )


def disagreement(attempt: dict[str, Any], obs: Observation) -> str | None:
    """Why the attempt row and pid.json name different processes; None when they agree (or
    one side is not known yet). attempts.pid is the wrapper pid the launcher returned (the tmux
    pane execs the wrapper), later pid.json's; proc_create_time is copied from pid.json."""
    record = obs.pid_record
    if record is None:
        return None
    row_pid, file_pid = attempt.get("pid"), record.get("pid")
    if row_pid and file_pid and int(row_pid) != int(file_pid):
        return f"the launcher started wrapper pid {row_pid} but pid.json names pid {file_pid}"
    row_time, file_time = attempt.get("proc_create_time"), record.get("create_time")
    if row_time is not None and file_time is not None and abs(float(row_time) - float(file_time)) > CREATE_TIME_TOLERANCE_S:
        return f"pid.json now names a process created at {file_time}, not the recorded {row_time}"
    return None


def judge(
    attempt: dict[str, Any], obs: Observation, hang_timeout_s: float, daemon_started_at_s: float | None = None
) -> Verdict:
    """Pure: the verdict on one live attempt from what was observed. A LOST verdict without
    pid.json must be confirmed by `mark_lost` before the attempt is closed."""
    if obs.exit_record is not None:
        return Verdict.FINISHED
    if obs.pid_record is None:
        started_at_s = float(attempt["started_at"])
        if attempt.get("launcher") is None and daemon_started_at_s is not None and started_at_s < daemon_started_at_s:
            return Verdict.LOST  # claimed by a dead daemon whose launch call never returned
        if obs.window_alive is False:
            return Verdict.LOST  # the window is gone, or its command ended, without pid.json
        if obs.now_s - started_at_s < LAUNCH_GRACE_S:
            return Verdict.PENDING
        return Verdict.LOST
    if not obs.process_alive:
        return Verdict.LOST
    if disagreement(attempt, obs) is not None:
        return Verdict.LOST  # alive only when pid, create time, pid.json and the row all agree
    # Alive while it makes output: progress.jsonl lines or stdout.log growing. 0 means `off`.
    last_sign_of_life = max(float(attempt["started_at"]), obs.last_progress_at or 0.0, obs.last_output_at or 0.0)
    if hang_timeout_s > 0 and obs.now_s - last_sign_of_life > hang_timeout_s:
        return Verdict.HUNG
    return Verdict.ALIVE


def mark_lost(run_dir: Path) -> bool:
    """Leave the lost marker, then look for pid.json. True: no worker can start for this run dir
    any more, the attempt may be closed as lost; False: a wrapper recorded itself first, so
    judge the attempt again on the next pass."""
    from orchestrator.launch.rundir import make_private_dirs  # yaml: not for every CLI start

    run_dir = Path(run_dir)
    try:
        make_private_dirs(run_dir)
        os.close(os.open(run_dir / LOST_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass  # left by an earlier pass
    except OSError as exc:
        # A run dir we cannot write to is one the wrapper cannot write pid.json to either.
        log.warning("cannot mark %s lost (%s); no wrapper can record itself there", run_dir, exc)
    return not (run_dir / PID_FILE).exists()


def group_is_ours(pgid: int | None, leader_create_time: float | None) -> bool:
    """A process group may be signalled only while it is still the attempt's: its leader is
    absent (exited, members linger) or is the recorded wrapper, and some member exists."""
    if not pgid or pgid <= 1:
        return False
    try:
        leader = psutil.Process(pgid)
        if leader_create_time is not None and abs(leader.create_time() - leader_create_time) > CREATE_TIME_TOLERANCE_S:
            return False  # the pgid now belongs to an unrelated process
    except psutil.NoSuchProcess:
        pass
    except psutil.AccessDenied:
        return False
    from orchestrator.launch.base import group_members

    return bool(group_members(pgid))
