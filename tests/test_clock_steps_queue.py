"""A wall-clock step (NTP, `date -s`, a VM resume) while jobs wait: how long a job has waited
(the starvation hold) and when the head's waiting reasons are worked out again are measured on
the daemon's monotonic clock, so a step either way changes neither. Real daemon, state.db, sim
GPUs and workers; the clock is the test's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clock_daemon import HOLD, big_job_waiting, clock_daemon
from hostile_helpers import hostile_command

from orchestrator.clock import FakeClock
from orchestrator.prediction.durations import CompletedRun
from orchestrator.scheduling import dispatch
from orchestrator.scheduling.packing.types import RunningAttempt
from orchestrator.scheduling.queue_waits import (
    MAX_TRUSTED_WAIT_BEFORE_S,
    QueueWaits,
    waited_before_s,
)
from orchestrator.store.queries import get_job
from orchestrator.store.rows import QueueEntry

STARVATION_S = 600


def _entry(job_id: int, queued_at: float) -> QueueEntry:
    return QueueEntry(job_id, "s", 0, 0, "[]", queued_at, "c", "d", None)


# ---- the measure itself (pure) -------------------------------------------------------------------

def test_a_wait_counts_on_the_monotonic_clock_whatever_the_wall_clock_does() -> None:
    clock, waits = FakeClock(start_s=1_000_000.0), QueueWaits()
    job = _entry(1, clock.now_s())
    assert waits.waited_s(job, clock.now_s(), clock.monotonic_s()) == 0.0
    clock.advance(100)
    clock.step_wall(3600)
    assert waits.waited_s(job, clock.now_s(), clock.monotonic_s()) == 100.0
    clock.advance(50)
    clock.step_wall(-7200)
    assert waits.waited_s(job, clock.now_s(), clock.monotonic_s()) == 150.0
    # on the scale of the (stepped) wall clock, as `pack` compares it with `now_s`
    assert waits.waiting_since_s([job], clock.now_s(), clock.monotonic_s()) == {1: clock.now_s() - 150.0}


def test_a_job_queued_before_the_daemon_saw_it_counts_that_time_bounded() -> None:
    assert waited_before_s(10_000.0, 9_400.0) == 600.0
    assert waited_before_s(10_000.0, 13_600.0) == 0.0  # queued "in the future": the clock went back
    assert waited_before_s(10_000.0, 10_000.0 - MAX_TRUSTED_WAIT_BEFORE_S - 1) == 0.0  # absurd
    assert waited_before_s(10_000.0, float("nan")) == 0.0
    waits = QueueWaits()
    waits.saw(_entry(1, 9_400.0), 10_000.0, 50.0)
    assert waits.waited_s(_entry(1, 9_400.0), 13_600.0, 60.0) == 610.0  # a later step changes nothing


def test_a_job_that_re_entered_the_queue_waits_from_then() -> None:
    waits = QueueWaits()
    assert waits.waited_s(_entry(1, 1_000.0), 1_000.0, 10.0) == 0.0
    assert waits.waited_s(_entry(1, 1_000.0), 1_900.0, 910.0) == 900.0
    assert waits.waited_s(_entry(1, 1_900.0), 1_900.0, 910.0) == 0.0  # retried: a new queued_at
    waits.forget([1])
    assert waits.since == {}


# ---- a real daemon ------------------------------------------------------------------------------

def test_a_wall_clock_step_forward_makes_no_job_starve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with clock_daemon(tmp_path, monkeypatch, gpus="1x32GiB", starvation_s=STARVATION_S) as d:
        big_job_waiting(d)
        d.clock.step_wall(3600)  # job 2's queued_at now reads an hour old
        d.clock.advance(60)  # it has waited about a minute
        d.submit("third", "1:c")  # job 4 fits beside jobs 1 and 3: no card is kept for job 2 yet
        d.tick_until(lambda: d.running(4), what="job 4 to backfill")
        reason = d.orch.read(lambda store: get_job(store, 2).wait_reason) or ""
        assert reason and "kept free" not in reason, reason  # it waits for memory, nothing kept


def test_a_wall_clock_step_back_does_not_stop_a_job_starving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with clock_daemon(tmp_path, monkeypatch, gpus="1x32GiB", starvation_s=STARVATION_S) as d:
        big_job_waiting(d)
        d.clock.step_wall(-7200)  # job 2's queued_at now reads two hours ahead
        d.clock.advance(STARVATION_S + 1)  # yet it has waited past the starvation time
        d.submit("third", "1:c")  # job 4 would fit, but the card is kept for job 2
        d.ticks(3)
        assert d.orch.job_states() == {1: "running", 2: "queued", 3: "running", 4: "queued"}
        assert len(d.orch.attempt_rows()) == 2
        reason = d.orch.read(lambda store: get_job(store, 4).wait_reason) or ""
        assert "kept free for job 2" in reason, reason


@pytest.fixture
def packs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[float, list[RunningAttempt]]]]:
    """Each call of `pack` by a scheduling pass (its `now_s` and running attempts): one per time
    the waiting reasons are worked out. The real `pack` runs."""
    calls: list[tuple[float, list[RunningAttempt]]] = []
    real = dispatch.pack

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append((args[4], args[2]))
        return real(*args, **kwargs)

    monkeypatch.setattr(dispatch, "pack", counted)
    yield calls


def test_waiting_reasons_are_refreshed_on_the_monotonic_clock_across_wall_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packs: list[tuple[float, list[RunningAttempt]]],
) -> None:
    with clock_daemon(tmp_path, monkeypatch, gpus="1x32GiB") as d:
        d.orch.write_suite("s", {"s": HOLD}, worker=hostile_command(), mem_gib=8, hang_timeout_s="off")
        d.cli("plan", "set", "1")  # one slot: while job 1 runs no card can take anything
        d.submit("s", "1:a,2:a")
        d.tick_until(lambda: d.running(1), what="job 1 running")
        d.tick_until(lambda: d.orch.read(lambda store: get_job(store, 2).wait_reason), what="job 2's reason")
        d.ticks(2)  # the reason written; its row stands from here on
        settled = len(packs)
        d.ticks(3)
        assert len(packs) == settled  # nothing changed and no time passed: the reasons stand
        d.clock.step_wall(-3600)
        d.clock.advance(dispatch.WAITING_REFRESH_S + 1)  # they are older than the refresh now
        d.ticks(1)
        assert len(packs) == settled + 1
        d.clock.step_wall(7200)  # wall time alone: the reasons are no older
        d.ticks(3)
        assert len(packs) == settled + 1


def test_a_running_attempts_expected_end_moves_with_a_wall_clock_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packs: list[tuple[float, list[RunningAttempt]]],
) -> None:
    # how soon a running attempt ends decides gang reservations, backfill beside them and the
    # start-ahead: its run so far is the daemon's own measure, not the wall clock's
    with clock_daemon(tmp_path, monkeypatch, gpus="1x32GiB") as d:
        for name, mem_gib in (("s", 8), ("big", 28)):
            d.orch.write_suite(name, {name: {**HOLD, "model": f"{name}-model"}}, worker=hostile_command(),
                               mem_gib=mem_gib, hang_timeout_s="off")
        d.submit("s", "1:a")
        d.tick_until(lambda: d.running(1), what="job 1 running")
        d.submit("big", "1:a")  # waits beside it: every pass packs
        d.daemon.scheduler.durations.add(CompletedRun("s", "a", 0, 3600.0))  # as if a run of it had taken an hour

        def left_s() -> float:
            packs.clear()
            d.ticks(1)
            now_s, running = packs[-1]
            (attempt,) = running
            assert attempt.expected_end_s is not None
            return attempt.expected_end_s - now_s

        before = left_s()
        assert 3500 < before <= 3600
        d.clock.advance(100)
        d.clock.step_wall(3600)
        assert left_s() == pytest.approx(before - 100)
        d.clock.advance(50)
        d.clock.step_wall(-7200)
        assert left_s() == pytest.approx(before - 150)
