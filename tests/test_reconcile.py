"""Deciding what happened to a live attempt: judge() on observations, the lost-marker handshake
with the wrapper, and the outcome of an attempt stopped from outside."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from orchestrator.lifecycle import AttemptOutcome
from orchestrator.outcomes import _stopped_from_outside
from orchestrator.reconcile import (
    Observation,
    Verdict,
    disagreement,
    judge,
    observe,
)

NOW = 1_000_000.0
HANG_S = 600.0


def attempt_row(**fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"id": 1, "started_at": NOW - 5, "launcher": "tmux", "window_id": "@3",
                           "pid": None, "pgid": None, "proc_create_time": None}
    return {**row, **fields}


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


def _write_pid_json(run_dir: Path, pid: int, create_time: float) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "pid.json").write_text(json.dumps({"pid": pid, "pgid": pid, "create_time": create_time}))


def test_adoption_of_a_real_process(tmp_path: Path) -> None:
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
    assert _stopped_from_outside(AttemptOutcome.FAILED, None, exit_record, None) is outside


def test_stopped_from_outside_never_overrides_orch_kills_results_or_other_outcomes() -> None:
    hup = {"exit_code": 129, "signal": 1, "received": ["SIGHUP"]}
    assert not _stopped_from_outside(AttemptOutcome.FAILED, "cancel", hup, None)
    assert not _stopped_from_outside(AttemptOutcome.FAILED, None, hup, {"status": "error"})
    assert not _stopped_from_outside(AttemptOutcome.OOM, None, hup, None)
    assert not _stopped_from_outside(AttemptOutcome.FAILED, None, None, None)
