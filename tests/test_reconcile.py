"""Deciding what happened to a live attempt: judge() on observations, the lost-marker handshake
with the wrapper, and the outcome of an attempt stopped from outside."""

from __future__ import annotations

import json
import stat
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
from rows_helpers import attempt_of

from orchestrator.attempts.next_step import stopped_from_outside
from orchestrator.attempts.reconcile import Verdict, disagreement, judge, observe
from orchestrator.executors.lost_marker import mark_lost
from orchestrator.executors.observation import LAUNCH_GRACE_S, Observation
from orchestrator.executors.wrapper.held_dir import HeldRunDir
from orchestrator.executors.wrapper.run import claim_run_dir
from orchestrator.lifecycle import AttemptOutcome
from orchestrator.rundir_files import RunDir
from orchestrator.store.rows import Attempt

NOW = 1_000_000.0
HANG_S = 600.0


def attempt_row(**fields: Any) -> Attempt:
    row: dict[str, Any] = {"id": 1, "started_at": NOW - 5, "executor": "tmux", "executor_id": "@3",
                           "pid": None, "pgid": None, "proc_create_time": None}
    return attempt_of(**{**row, **fields})


def observation(pid_record: dict[str, Any] | None = None, *, alive: bool = False, **fields: Any) -> Observation:
    base: dict[str, Any] = {"pid_record": pid_record, "exit_record": None, "process_alive": alive,
                            "last_progress": None, "last_progress_at": None, "now_s": NOW}
    return Observation(**{**base, **fields})


def test_judge_alive_only_when_the_row_and_pid_json_agree() -> None:
    record = {"pid": 4242, "pgid": 4242, "create_time": 500.0}
    obs = observation(record, alive=True)
    assert judge(attempt_row(pid=None), obs, HANG_S) is Verdict.ALIVE  # the row knows no pid yet
    assert judge(attempt_row(pid=4242), obs, HANG_S) is Verdict.ALIVE
    assert judge(attempt_row(pid=4242, proc_create_time=500.4), obs, HANG_S) is Verdict.ALIVE
    assert judge(attempt_row(pid=999), obs, HANG_S) is Verdict.LOST
    assert "999" in (disagreement(attempt_row(pid=999), obs) or "")
    assert judge(attempt_row(pid=4242, proc_create_time=400.0), obs, HANG_S) is Verdict.LOST
    assert judge(attempt_row(pid=4242), observation(record, alive=False), HANG_S) is Verdict.LOST


def test_a_pid_json_naming_another_process_stays_lost_once_its_end_is_recorded() -> None:
    # the daemon SIGTERMs the real group of a lost attempt; the wrapper then records that end:
    # still lost (never read as a signal from outside, which would requeue it uncounted forever)
    forged = {"pid": 4242, "pgid": 4242, "create_time": 500.0}
    ended = {"exit_code": None, "signal": 15, "received": ["SIGTERM"]}
    obs = observation(forged, alive=False, launcher_alive=False, exit_record=ended)
    assert judge(attempt_row(pid=999, proc_create_time=900.0), obs, HANG_S) is Verdict.LOST
    assert judge(attempt_row(pid=4242, proc_create_time=400.0), obs, HANG_S) is Verdict.LOST
    assert judge(attempt_row(pid=4242, proc_create_time=500.0), obs, HANG_S) is Verdict.FINISHED


def _write_pid_json(run_dir: Path, pid: int, create_time: float) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "pid.json").write_text(json.dumps({"pid": pid, "pgid": pid, "create_time": create_time}))


def test_adoption_of_a_real_process(tmp_path: Path) -> None:
    tmp_path = tmp_path / "runs" / "s" / "job" / "attempt-1"  # run dirs are read only inside a runs tree
    me = psutil.Process()
    now = time.time()
    _write_pid_json(tmp_path, me.pid, me.create_time())
    obs = observe(tmp_path, now)
    assert obs.process_alive
    assert judge(attempt_row(pid=me.pid, started_at=now), obs, HANG_S) is Verdict.ALIVE
    assert judge(attempt_row(pid=me.pid + 1, started_at=now), obs, HANG_S) is Verdict.LOST
    # the pid is ours but the create time is not: a reused pid, never adopted
    _write_pid_json(tmp_path, me.pid, me.create_time() - 3600)
    obs = observe(tmp_path, now)
    assert not obs.process_alive
    assert judge(attempt_row(pid=me.pid, started_at=now), obs, HANG_S) is Verdict.LOST


@pytest.mark.parametrize(
    ("exit_record", "outside"),
    [
        # the wrapper names what reached it: that decides, whatever the exit code
        ({"exit_code": 1, "signal": None, "received": ["SIGHUP"]}, True),
        ({"exit_code": 143, "signal": 15, "received": ["SIGTERM"]}, True),
        ({"exit_code": 143, "signal": None, "received": []}, False),
        ({"exit_code": 129, "signal": 1, "received": []}, False),
        ({"exit_code": 130, "signal": 2, "received": ["SIGINT"]}, False),
        # older records without "received": inferred from the exit status
        ({"exit_code": 143, "signal": 15}, True),
        ({"exit_code": 129, "signal": None}, True),
        ({"exit_code": 1, "signal": None}, False),
    ],
)
def test_stopped_from_outside(exit_record: dict[str, Any], outside: bool) -> None:
    assert stopped_from_outside(AttemptOutcome.FAILED, None, exit_record, None) is outside


def test_stopped_from_outside_never_overrides_orch_kills_results_or_other_outcomes() -> None:
    hup = {"exit_code": 129, "signal": 1, "received": ["SIGHUP"]}
    assert not stopped_from_outside(AttemptOutcome.FAILED, "cancel", hup, None)
    assert not stopped_from_outside(AttemptOutcome.FAILED, None, hup, {"status": "error"})
    assert not stopped_from_outside(AttemptOutcome.OOM, None, hup, None)
    assert not stopped_from_outside(AttemptOutcome.FAILED, None, None, None)


# -- claimed but never launched ---------------------------------------------------------------

DAEMON_START = NOW - 2  # this daemon started 2 s ago
ADOPTED = True  # claimed before this daemon started (its attempt id says so)


def test_claimed_by_a_dead_daemon_and_never_launched_is_lost_at_once() -> None:
    row = attempt_row(executor=None, executor_id=None, started_at=DAEMON_START - 1)
    assert judge(row, observation(), HANG_S, ADOPTED) is Verdict.LOST
    # claimed by this daemon: the grace period, whatever the wall clock says of its claim
    assert judge(row, observation(), HANG_S) is Verdict.PENDING
    ours = attempt_row(executor=None, executor_id=None, started_at=DAEMON_START + 1)
    assert judge(ours, observation(), HANG_S, not ADOPTED) is Verdict.PENDING
    late = observation(silent_s=LAUNCH_GRACE_S + 1)  # watched that long by this daemon without pid.json
    assert judge(ours, late, HANG_S, not ADOPTED) is Verdict.LOST


def test_window_open_but_no_pid_json_yet_waits_within_the_grace() -> None:
    row = attempt_row(started_at=DAEMON_START - 1)  # launched by the dead daemon: its executor recorded
    assert judge(row, observation(started_alive=True), HANG_S, ADOPTED) is Verdict.PENDING
    assert judge(row, observation(started_alive=None), HANG_S, ADOPTED) is Verdict.PENDING
    assert judge(row, observation(started_alive=False), HANG_S, ADOPTED) is Verdict.LOST
    late = observation(started_alive=True, silent_s=LAUNCH_GRACE_S + 1)
    assert judge(row, late, HANG_S, ADOPTED) is Verdict.LOST
    stepped = observation(started_alive=True, now_s=row.started_at + 3600, silent_s=1.0)  # a wall-clock step
    assert judge(row, stepped, HANG_S, ADOPTED) is Verdict.PENDING


def test_an_exit_or_pid_record_overrides_the_launch_checks() -> None:
    row = attempt_row(executor=None, executor_id=None, started_at=DAEMON_START - 1)
    assert judge(row, observation(exit_record={"exit_code": 0}), HANG_S, ADOPTED) is Verdict.FINISHED
    record = {"pid": 4242, "pgid": 4242, "create_time": 500.0}
    assert judge(row, observation(record, alive=True, started_alive=False), HANG_S, ADOPTED) is Verdict.ALIVE


def test_mark_lost_creates_the_marker_unless_a_wrapper_recorded_itself(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "s" / "job" / "attempt-1"  # never prepared: the daemon died first
    assert mark_lost(run_dir)
    assert (run_dir / RunDir.LOST_MARKER).is_file()
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert mark_lost(run_dir)  # again on the next pass: still lost
    other = tmp_path / "attempt-2"
    other.mkdir()
    (other / "pid.json").write_text("{}")
    assert not mark_lost(other)


def test_the_wrapper_and_mark_lost_never_both_go_on(tmp_path: Path) -> None:
    """Both sides at once, many times: never a started worker for an attempt declared lost."""
    outcomes: Counter[tuple[bool, bool]] = Counter()
    for trial in range(300):
        run_dir = tmp_path / f"attempt-{trial}"
        run_dir.mkdir()
        barrier = threading.Barrier(2)
        claimed: list[bool] = []

        def wrapper_side(
            run_dir: Path = run_dir, barrier: threading.Barrier = barrier, claimed: list[bool] = claimed
        ) -> None:
            with HeldRunDir(run_dir) as held:
                barrier.wait()
                claimed.append(claim_run_dir(held, {"pid": 1}))

        thread = threading.Thread(target=wrapper_side)
        thread.start()
        barrier.wait()
        lost = mark_lost(run_dir)
        thread.join()
        outcomes[(claimed[0], lost)] += 1
    assert outcomes[(True, True)] == 0, outcomes
    assert outcomes[(True, False)] + outcomes[(False, True)] > 0, outcomes
