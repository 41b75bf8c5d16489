"""A wall-clock step (NTP, `date -s`, a VM resume) while workers run: hang detection is the
daemon's own measure of silence on its monotonic clock, so a +1 h step kills no healthy worker
and a -1 h step does not switch hang detection off. Real daemon, state.db, sim GPUs and
workers; the clock is the test's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from clock_daemon import ClockDaemon, clock_daemon
from hostile_helpers import hostile_command

HOLD = {"corrupt": "none", "hold_s": 600}  # a worker that starts, says nothing and stays
HANG_S = 300


def _running(d: ClockDaemon) -> Path:
    d.orch.write_suite("h", {"h": HOLD}, worker=hostile_command(), mem_gib=0.25, hang_timeout_s=HANG_S)
    d.submit("h", "1:a")
    attempt = d.tick_until(lambda: d.running(1), what="the attempt running")
    return Path(attempt.run_dir) / "stdout.log"


def _prints(d: ClockDaemon, log: Path) -> None:
    """The worker prints a line now; the file is stamped by the (stepped) wall clock."""
    with log.open("a") as out:
        out.write("step\n")
    stamp = d.clock.now_s()
    os.utime(log, (stamp, stamp))


def test_a_wall_clock_step_forward_kills_no_healthy_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with clock_daemon(tmp_path, monkeypatch) as d:
        log = _running(d)
        _prints(d, log)
        d.ticks(1)
        d.clock.step_wall(3600)  # its last line is now "an hour old" by the wall clock
        d.clock.advance(8)
        d.ticks(3)
        assert [(a.kill_requested, a.outcome) for a in d.orch.attempt_rows(1)] == [(None, None)]
        for _ in range(4):  # printing every 20 s, as before the step
            d.clock.advance(20)
            _prints(d, log)
            d.ticks(1)
        assert [(a.kill_requested, a.outcome) for a in d.orch.attempt_rows(1)] == [(None, None)]
        d.clock.advance(HANG_S + 1)  # then silent for longer than the hang timeout: hung
        d.tick_until(lambda: d.attempt(1).kill_requested == "hung", what="the hang to be seen")


def test_a_wall_clock_step_back_keeps_hang_detection_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with clock_daemon(tmp_path, monkeypatch) as d:
        log = _running(d)
        _prints(d, log)
        d.ticks(1)
        d.clock.step_wall(-3600)  # its last line now seems written an hour from now
        d.clock.advance(HANG_S - 10)
        d.ticks(2)
        assert [(a.kill_requested, a.outcome) for a in d.orch.attempt_rows(1)] == [(None, None)]  # silent 290 s of 300
        d.clock.advance(11)
        d.tick_until(lambda: d.attempt(1).kill_requested == "hung", what="the hang to be seen")
