"""What happened to a live attempt: read its run dir and processes, then decide (pure).

Run at daemon start and every tick. The run dir's files are the source of truth for what
happened (the wrapper writes pid.json before the worker starts and exit.json after it ends),
but they are written where user code runs, so they are read only through `attempts.rundir_reads` (no
symlinks, size limits, every field checked) and never decide which process orch signals. The
launcher's record does: the wrapper pid it returned and the create time orch read at launch
(attempts.pid, proc_create_time). An attempt is alive when that process runs; pid.json, when
valid, must agree with it (else the attempt is lost, logged with the reason); a pid.json that
is invalid is named in the attempt's reason and otherwise ignored.

Claimed but never launched. `start_attempt` commits the attempt (job -> running) before the
executor is called, and the daemon records `executor`/`executor_id`/`pid` right after the call
returns. An attempt without pid.json is judged so:
- no launcher recorded and claimed before this daemon started (`adopted`, told by its attempt
  id, never by comparing wall times a clock step moves): the daemon that claimed it is dead, so
  no launch call of it can still return: lost at once;
- its window is gone, or its command ended, without writing pid.json: lost at once;
- otherwise (window alive, or nothing to look at) pending for up to LAUNCH_GRACE_S.
The old daemon may have died right after tmux opened the window, with the wrapper still
starting. So before any attempt without pid.json is declared lost, `mark_lost`
(executors.lost_marker) creates the run dir's lost marker (O_EXCL) and then looks for
pid.json; the wrapper (claim_run_dir) creates pid.json exclusively and then looks for the
marker. Each writes its flag before reading the other's, so at most one goes on: either the
wrapper never starts the worker, or the daemon sees pid.json and judges the attempt again on
its next pass, as usual.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from orchestrator.attempts import rundir_reads as runfiles
from orchestrator.executors.observation import LAUNCH_GRACE_S, Observation
from orchestrator.executors.wrapper.run import LOCAL_PREFIX, PORTABLE_PREFIX
from orchestrator.procstat import process_matches, same_start
from orchestrator.store.rows import Attempt

if TYPE_CHECKING:
    from orchestrator.attempts.observe_cache import ObserveCache
    from orchestrator.executors.process_groups import ProcessGroups


PROGRESS_REFRESH_S = 5.0  # the daemon reads a running worker's new progress lines this often


class Verdict(str, Enum):
    PENDING = "pending"  # launched, wrapper not yet recorded
    ALIVE = "alive"
    HUNG = "hung"  # alive but silent for longer than the suite's hang timeout
    FINISHED = "finished"  # exit record present
    LOST = "lost"  # no live process and no exit record


def read_result(run_dir: Path, problems: list[str] | None = None) -> dict[str, Any] | None:
    return runfiles.read_result(run_dir, problems)


def read_log_tail(run_dir: Path, max_bytes: int = runfiles.LOG_TAIL_BYTES) -> str:
    return runfiles.read_log_tail(run_dir, max_bytes)


def launcher_record(attempt: Attempt) -> tuple[int, float] | None:
    """(wrapper pid, its create time) as orch recorded them at launch; None when unknown."""
    pid, create_time = attempt.pid, attempt.proc_create_time
    if not pid or create_time is None:
        return None
    return pid, create_time


def wrapper_create_time(pid: int, run_dir: Path) -> float | None:
    """The create time of `pid` when it is, provably, orch's wrapper for this run dir: a
    process of this user whose command line is the wrapper's for exactly `run_dir`. None
    otherwise (a pid named by a file must never be enough to signal a process)."""
    try:
        proc = psutil.Process(pid)
        if proc.uids().real != os.getuid() or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        cmdline = proc.cmdline()
        tail = ["--run-dir", str(run_dir), "--"]
        if not any(cmdline[1 : 3 + len(tail)] == [*prefix, *tail] for prefix in (LOCAL_PREFIX, PORTABLE_PREFIX)):
            return None
        return float(proc.create_time())
    except (psutil.Error, OSError, ValueError):
        return None


def observe(
    run_dir: Path, now_s: float, attempt: Attempt | None = None, cache: ObserveCache | None = None,
    hang_timeout_s: float = 0.0,
) -> Observation:
    """Read the run dir (through the validating boundary) and check the processes. A process
    is checked before its exit record is read, so one that ends in between is not taken for lost.
    `cache` (the daemon's): files read again only when they changed, processes held by pidfd."""
    run_dir = run_dir if isinstance(run_dir, Path) else Path(run_dir)
    # progress shown at most this old; a quarter of the hang timeout, so it never looks hung
    max_age_s = min(PROGRESS_REFRESH_S, hang_timeout_s / 4) if hang_timeout_s > 0 else PROGRESS_REFRESH_S

    def read(path: Path, settled: bool = False) -> runfiles.RunFiles:
        return cache.run_files(path, max_age_s, settled) if cache is not None else runfiles.read_run_files(path)

    def matches(pid: int, create_time: float | None) -> bool:
        return (
            cache.process_matches(pid, create_time, process_matches)
            if cache is not None
            else process_matches(pid, create_time)
        )

    record = launcher_record(attempt) if attempt is not None else None
    launcher_alive = matches(*record) if record is not None else None
    # The wrapper orch launched is alive: between refreshes its files are not looked at (its
    # end comes as a poke, or as its pidfd turning readable, and then they are).
    files = read(run_dir, settled=bool(launcher_alive))
    alive = False
    if files.pid_record is not None:
        alive = matches(files.pid_record["pid"], files.pid_record["create_time"])
    if files.exit_record is None and not (alive or launcher_alive):
        files = read(run_dir)  # it may have ended, with its record, just now

    output = runfiles.stat_output(run_dir)
    exit_record, problems = files.exit_record, list(files.problems)
    if exit_record is not None and attempt is not None and attempt.token and exit_record.get("token") != attempt.token:
        # written by another attempt's worker (all run as one user): not this attempt's end
        problems.append("exit.json: not written by this attempt's wrapper (no matching token); ignored")
        exit_record = None
    return Observation(
        last_output_at=output.mtime_s if output is not None else None,
        pid_record=files.pid_record,
        exit_record=exit_record,
        process_alive=alive,
        last_progress=files.last_progress,
        last_progress_at=files.last_progress_at,
        now_s=now_s,
        launcher_alive=launcher_alive,
        pid_file_present=files.pid_file_present,
        problems=tuple(problems),
    )


def disagreement(attempt: Attempt, obs: Observation) -> str | None:
    """Why the attempt row and pid.json name different processes; None when they agree (or
    one side is not known yet). attempts.pid is the wrapper pid the launcher returned (the tmux
    pane execs the wrapper), later pid.json's; proc_create_time is copied from pid.json."""
    record = obs.pid_record
    if record is None:
        return None
    row_pid, file_pid = attempt.pid, record.get("pid")
    if row_pid and file_pid and int(row_pid) != int(file_pid):
        return f"the launcher started wrapper pid {row_pid} but pid.json names pid {file_pid}"
    row_time, file_time = attempt.proc_create_time, record.get("create_time")
    if row_time is not None and file_time is not None and not same_start(float(row_time), float(file_time)):
        return f"pid.json now names a process created at {file_time}, not the recorded {row_time}"
    return None


def judge(attempt: Attempt, obs: Observation, hang_timeout_s: float, adopted: bool = False) -> Verdict:
    """Pure: the verdict on one live attempt from what was observed. A LOST verdict without
    pid.json must be confirmed by `mark_lost` before the attempt is closed. A pid.json that
    exists but is invalid is ignored: the attempt is judged on the wrapper orch launched."""
    if disagreement(attempt, obs) is not None:
        # pid.json names another process than the one launched: lost, whatever end is recorded
        # later (the daemon's own SIGTERM to the real group must not read as a stranger's)
        return Verdict.LOST
    if obs.exit_record is not None:
        return Verdict.FINISHED
    if obs.pid_record is None:
        if obs.pid_file_present:
            return _judge_alive(attempt, obs, hang_timeout_s) if obs.launcher_alive else Verdict.LOST
        if attempt.executor is None and adopted:
            return Verdict.LOST  # claimed by a dead daemon whose launch call never returned
        if obs.started_alive is False and not obs.launcher_alive:
            # the window is gone, or its command ended, without pid.json (a wrapper the
            # launcher started that still runs, its window killed with its server, is awaited)
            return Verdict.LOST
        if obs.silent_s is None or obs.silent_s < LAUNCH_GRACE_S:
            return Verdict.PENDING
        return Verdict.LOST
    alive = obs.launcher_alive if obs.launcher_alive is not None else obs.process_alive
    if not alive:
        return Verdict.LOST
    return _judge_alive(attempt, obs, hang_timeout_s)


def _judge_alive(attempt: Attempt, obs: Observation, hang_timeout_s: float) -> Verdict:
    # Alive while it makes output (progress.jsonl lines, stdout.log growing), as long as the
    # daemon measured it on its own monotonic clock. 0 means `off`.
    if hang_timeout_s > 0 and obs.silent_s is not None and obs.silent_s > hang_timeout_s:
        return Verdict.HUNG
    return Verdict.ALIVE


def proven_group(attempt: Attempt, obs: Observation | None) -> tuple[int, float] | None:
    """(pgid, leader create time) of the attempt's process group, only from what proves orch
    started it: the wrapper pid and create time recorded at launch (the wrapper leads its own
    group, so pgid = pid), else, for an attempt adopted without that record, pid.json's pid
    when that process is this user's wrapper for this very run dir. Never a pgid from a file."""
    record = launcher_record(attempt)
    if record is not None:
        return record
    pid_record = obs.pid_record if obs is not None else None
    if pid_record is None:
        return None
    pid = int(pid_record["pid"])
    create_time = wrapper_create_time(pid, Path(attempt.run_dir))
    if create_time is None or not same_start(create_time, float(pid_record["create_time"])):
        return None
    return pid, create_time


def group_is_ours(pgid: int | None, leader_create_time: float | None, groups: ProcessGroups | None = None) -> bool:
    """A process group may be signalled only while it is still the attempt's: its leader is
    absent (exited, members linger) or is the recorded wrapper, and some member exists
    (`groups`: this pass's read of the process table, shared by every group asked about)."""
    if not pgid or pgid <= 1:
        return False
    try:
        leader = psutil.Process(pgid)
        if leader_create_time is not None and not same_start(leader.create_time(), leader_create_time):
            return False  # the pgid now belongs to an unrelated process
    except psutil.NoSuchProcess:
        pass
    except psutil.AccessDenied:
        return False
    from orchestrator.executors.process_groups import ProcessGroups

    return (groups or ProcessGroups()).alive(pgid)
