"""Stopping a process group across daemon passes: the pure state machine, the stopper with a
clock the test moves (no sleeps), and one real group that ignores SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import group_alive, wait_until

from orchestrator.attempts.kills import (
    KILL_GRACE_S,
    KILL_RESEND_S,
    STUCK_S,
    GroupStopper,
    KillState,
    KillStep,
    after,
    is_stuck,
    next_step,
)
from orchestrator.clock import FakeClock
from orchestrator.executors.process_groups import ProcessGroups

NO_SUCH_PID = 99_999_999  # above any pid_max: its "leader" never exists, so only the fake table speaks


# -- the pure core -----------------------------------------------------------------------------

def test_a_live_group_is_sent_sigterm_first_then_waited_for() -> None:
    assert next_step(KillState(), alive=True, now_s=0.0) is KillStep.TERM
    term = after(KillState(), KillStep.TERM, 10.0)
    assert term == KillState(term_at_s=10.0)
    assert next_step(term, True, 10.0) is KillStep.WAIT
    assert next_step(term, True, 10.0 + KILL_GRACE_S - 0.01) is KillStep.WAIT


def test_sigkill_once_the_grace_is_over_and_again_while_members_outlive_it() -> None:
    term = KillState(term_at_s=10.0)
    assert next_step(term, True, 10.0 + KILL_GRACE_S) is KillStep.KILL
    assert next_step(term, True, 10.0 + 2, grace_s=2.0) is KillStep.KILL  # the grace is a setting
    killed = after(term, KillStep.KILL, 16.0)
    assert killed == KillState(term_at_s=10.0, kill_at_s=16.0, last_kill_at_s=16.0)
    assert next_step(killed, True, 16.0 + KILL_RESEND_S / 2) is KillStep.WAIT
    assert next_step(killed, True, 16.0 + KILL_RESEND_S) is KillStep.KILL
    resent = after(killed, KillStep.KILL, 17.0)
    assert (resent.kill_at_s, resent.last_kill_at_s) == (16.0, 17.0)  # the first SIGKILL is kept
    assert next_step(resent, True, 17.5, resend_s=1.0) is KillStep.WAIT


@pytest.mark.parametrize("state", [KillState(), KillState(term_at_s=1.0), KillState(term_at_s=1.0, kill_at_s=7.0)])
def test_a_group_with_no_member_left_is_gone_whatever_was_sent(state: KillState) -> None:
    assert next_step(state, alive=False, now_s=100.0) is KillStep.GONE


def test_stuck_only_long_after_sigkill() -> None:
    killed = KillState(term_at_s=0.0, kill_at_s=5.0)
    assert not is_stuck(KillState(term_at_s=0.0), True, 1000.0)  # no SIGKILL yet
    assert not is_stuck(killed, True, 5.0 + STUCK_S - 1)
    assert is_stuck(killed, True, 5.0 + STUCK_S)
    assert not is_stuck(killed, False, 5.0 + STUCK_S)


# -- the stopper, with a fake process table and a clock the test moves --------------------------

class FakeTable:
    """Stands for one pass's read of the process table; counts the reads."""

    reads = 0

    def __init__(self, alive: set[int]) -> None:
        FakeTable.reads += 1
        self._alive = alive

    def alive(self, pgid: int) -> bool:
        return pgid in self._alive


def _stopper(clock: FakeClock, alive: set[int], sent: list[tuple[int, int]]) -> GroupStopper:
    def send(pgid: int, sig: int) -> bool:
        sent.append((pgid, sig))
        return pgid in alive

    return GroupStopper(clock, send=send, read_groups=lambda: FakeTable(alive))  # type: ignore[arg-type, return-value]


def test_stop_never_waits_and_escalates_on_a_later_pass_once_the_clock_passes_the_grace() -> None:
    clock, alive, sent = FakeClock(), {NO_SUCH_PID}, []
    stopper = _stopper(clock, alive, sent)
    assert stopper.stop(7, NO_SUCH_PID, None) is False
    assert sent == [(NO_SUCH_PID, signal.SIGTERM)]
    for _ in range(3):  # passes within the grace send nothing more
        clock.advance(KILL_GRACE_S / 4)
        stopper.new_pass()
        assert stopper.stop(7, NO_SUCH_PID, None) is False
    assert sent == [(NO_SUCH_PID, signal.SIGTERM)]
    clock.advance(KILL_GRACE_S / 4)
    stopper.new_pass()
    assert stopper.stop(7, NO_SUCH_PID, None) is False
    assert sent[-1] == (NO_SUCH_PID, signal.SIGKILL)
    alive.clear()  # SIGKILL took it
    stopper.new_pass()
    assert stopper.stop(7, NO_SUCH_PID, None) is True
    assert stopper.pending() == {}


def test_one_read_of_the_process_table_per_pass_serves_every_pending_stop() -> None:
    clock, sent = FakeClock(), []
    groups = {NO_SUCH_PID + i for i in range(5)}
    stopper = _stopper(clock, groups, sent)
    reads = FakeTable.reads
    stopper.new_pass()
    for i, pgid in enumerate(sorted(groups)):
        assert stopper.stop(i, pgid, None) is False
    assert FakeTable.reads == reads + 1
    assert len(sent) == 5 and {s for _, s in sent} == {signal.SIGTERM}
    assert set(stopper.pending()) == set(range(5))


def test_a_group_gone_before_the_first_signal_ends_at_once() -> None:
    clock, sent = FakeClock(), []
    stopper = _stopper(clock, set(), sent)
    assert stopper.stop(1, NO_SUCH_PID, None) is True
    assert sent == []


def test_a_group_that_vanished_between_the_read_and_the_signal_is_gone() -> None:
    clock = FakeClock()
    stopper = GroupStopper(
        clock,
        send=lambda pgid, sig: False,
        read_groups=lambda: FakeTable({NO_SUCH_PID}),  # type: ignore[arg-type, return-value]
    )
    assert stopper.stop(1, NO_SUCH_PID, None) is True
    assert stopper.pending() == {}


def test_members_that_outlive_sigkill_keep_the_attempt_open_and_are_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, alive, sent = FakeClock(), {NO_SUCH_PID}, []
    stopper = _stopper(clock, alive, sent)
    caplog.set_level(logging.WARNING, logger="orchestrator.attempts.kills")
    stopper.stop(1, NO_SUCH_PID, None)
    for _ in range(int((KILL_GRACE_S + STUCK_S) / KILL_RESEND_S) + 5):
        clock.advance(KILL_RESEND_S)
        stopper.new_pass()
        assert stopper.stop(1, NO_SUCH_PID, None) is False
    assert sum(1 for _, s in sent if s == signal.SIGKILL) >= STUCK_S / KILL_RESEND_S
    assert sum("uninterruptible" in r.getMessage() for r in caplog.records) == 1


def test_stops_of_attempts_closed_elsewhere_are_forgotten() -> None:
    clock, sent = FakeClock(), []
    stopper = _stopper(clock, {NO_SUCH_PID, NO_SUCH_PID + 1}, sent)
    stopper.stop(1, NO_SUCH_PID, None)
    stopper.stop(2, NO_SUCH_PID + 1, None)
    stopper.keep_only([2])
    assert set(stopper.pending()) == {2}


def test_a_pgid_whose_leader_is_now_another_process_is_never_signalled() -> None:
    clock, sent = FakeClock(), []
    own_pid = os.getpid()  # a live leader created long before the recorded time
    stopper = _stopper(clock, {own_pid}, sent)
    assert stopper.stop(1, own_pid, 12345.0) is True
    assert sent == []


def test_fake_clock_never_goes_back() -> None:
    clock = FakeClock(start_s=100.0)
    clock.advance(5)
    assert (clock.now_s(), clock.monotonic_s() - FakeClock(0).monotonic_s()) == (105.0, 5.0)
    with pytest.raises(ValueError):
        clock.advance(-1)


# -- a real group that ignores SIGTERM -------------------------------------------------------

def test_a_real_group_ignoring_sigterm_is_killed_after_the_clock_passes_the_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (
        "import pathlib, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']); "
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        wait_until(ready.exists, 30, "the group to start")
        clock = FakeClock()
        stopper = GroupStopper(clock)
        leader_created = __import__("psutil").Process(proc.pid).create_time()
        assert stopper.stop(1, proc.pid, leader_created) is False  # SIGTERM, ignored
        stopper.new_pass()
        assert stopper.stop(1, proc.pid, leader_created) is False
        assert ProcessGroups().alive(proc.pid)  # the clock has not moved: no SIGKILL yet
        clock.advance(KILL_GRACE_S)

        def stopped() -> bool:
            stopper.new_pass()
            proc.poll()  # reap the leader, as a launcher does
            return stopper.stop(1, proc.pid, leader_created)

        wait_until(stopped, 10, "the group to be gone after SIGKILL")
        assert not group_alive(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- an ended attempt whose group lingers keeps its memory counted -----------------------------

def test_an_ending_attempt_keeps_its_peak_counted_on_its_cards() -> None:
    from orchestrator.attempts.kills import ending_peaks_mib, with_memory_held
    from orchestrator.gpu.snapshot import GpuSnapshot

    assert ending_peaks_mib("GPU-a", 15360, 9000, {}) == {"GPU-a": 15360}
    assert ending_peaks_mib("GPU-a", 0, 9000, {}) == {"GPU-a": 9000}
    assert ending_peaks_mib("GPU-a", 1, 9000, {"GPU-a": 7, "GPU-b": 8}) == {"GPU-a": 7, "GPU-b": 8}
    assert ending_peaks_mib("GPU-a", 5, 9000, {"GPU-a": "junk"}) == {"GPU-a": 5}
    cards = (GpuSnapshot(0, "GPU-a", "sim", 24576, 0, 24576), GpuSnapshot(1, "GPU-b", "sim", 24576, 20000, 4576))
    held = with_memory_held(cards, {"GPU-a": 15360, "GPU-b": 8000})
    assert [c.free_mib for c in held] == [24576 - 15360, 0]
    assert with_memory_held(cards, {}) is cards


def test_the_process_table_is_read_once_for_every_group_asked_about(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    from orchestrator.executors import process_groups as base

    reads: list[int] = []
    real = psutil.pids
    monkeypatch.setattr(base.psutil, "pids", lambda: reads.append(1) or real())
    groups = ProcessGroups()
    assert reads == []  # nothing read until asked
    assert groups.alive(os.getpgid(0))  # this test's own group
    assert not groups.alive(NO_SUCH_PID)
    assert groups.alive(os.getpgid(0))
    assert reads == [1]


def test_strays_get_sigterm_then_sigkill_after_their_shorter_grace() -> None:
    from orchestrator.attempts.containment import STRAY_GRACE_S, Hunt, plan_stop

    hunt = Hunt()
    assert plan_stop(hunt, True, 100.0) is KillStep.TERM
    hunt.state = after(hunt.state, KillStep.TERM, 100.0)
    assert plan_stop(hunt, True, 100.0 + STRAY_GRACE_S - 0.1) is KillStep.WAIT
    assert plan_stop(hunt, True, 100.0 + STRAY_GRACE_S) is KillStep.KILL
    assert plan_stop(hunt, False, 100.0 + STRAY_GRACE_S) is KillStep.GONE


def test_what_was_hunted_is_said_in_one_line() -> None:
    from orchestrator.attempts.containment import describe

    assert describe({12: "python", 13: "sleep"}, "found by its cgroup", "by orch after its process group ended") == (
        "2 processes were left running and ended by orch after its process group ended "
        "(pid 12 python, 13 sleep; found by its cgroup)")
    many = describe({pid: "w" for pid in range(10, 20)}, "found by its environment", "by orch")
    assert "and 2 more" in many and many.startswith("10 processes")
