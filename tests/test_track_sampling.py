"""Host RAM and CPU of a running attempt: read at every pass while it ramps up, then every
HOST_SAMPLE_S (the /proc reads per process are most of a settled pass's cost)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from orchestrator.attempts.resource_use import HOST_SAMPLE_S, HOST_WARMUP_S, ResourceTracker
from orchestrator.gpu.host import HostSnapshot
from tests.rows_helpers import attempt_of


class CountingHost:
    def __init__(self) -> None:
        self.reads = 0
        self.mib = 100

    def snapshot(self) -> HostSnapshot:
        return HostSnapshot(1000, 1000, 1)

    def tree_mib(self, pids: Iterable[int]) -> int:
        self.reads += 1
        return self.mib


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def _passes(tracker: ResourceTracker, clock: Clock, reached_peak: int, seconds: float, step_s: float = 1.0) -> None:
    end = clock.now_s + seconds
    while clock.now_s < end:
        tracker.fields(attempt_of(reached_peak=reached_peak), [os.getpid()], {})
        clock.now_s += step_s


def test_a_settled_attempt_is_read_every_few_seconds_after_its_warmup() -> None:
    host, clock = CountingHost(), Clock()
    tracker = ResourceTracker(host, clock)
    _passes(tracker, clock, reached_peak=1, seconds=HOST_WARMUP_S)
    assert host.reads == HOST_WARMUP_S  # every pass while it is new
    host.reads = 0
    _passes(tracker, clock, reached_peak=1, seconds=4 * HOST_SAMPLE_S)
    assert host.reads == 4


def test_an_attempt_still_ramping_up_is_read_at_every_pass() -> None:
    host, clock = CountingHost(), Clock()
    tracker = ResourceTracker(host, clock)
    _passes(tracker, clock, reached_peak=0, seconds=HOST_WARMUP_S + 20)
    assert host.reads == HOST_WARMUP_S + 20


def test_a_reading_between_samples_changes_nothing_and_the_next_sample_records_the_peak() -> None:
    host, clock = CountingHost(), Clock()
    tracker = ResourceTracker(host, clock)
    _passes(tracker, clock, reached_peak=1, seconds=HOST_WARMUP_S)
    host.mib = 900
    skipped = tracker.fields(attempt_of(reached_peak=1, host_peak_mib=100, host_held_mib=100), [os.getpid()], {})
    assert "host_peak_mib" not in skipped
    clock.now_s += HOST_SAMPLE_S
    read = tracker.fields(attempt_of(reached_peak=1, host_peak_mib=100, host_held_mib=100), [os.getpid()], {})
    assert (read["host_held_mib"], read["host_peak_mib"]) == (900, 900)


def test_a_forgotten_attempt_is_new_again() -> None:
    host, clock = CountingHost(), Clock()
    tracker = ResourceTracker(host, clock)
    _passes(tracker, clock, reached_peak=1, seconds=HOST_WARMUP_S + 10)
    tracker.forget(1)
    host.reads = 0
    _passes(tracker, clock, reached_peak=1, seconds=3)
    assert host.reads == 3


def test_settled_attempts_are_read_together_in_one_pass() -> None:
    host, clock = CountingHost(), Clock()
    tracker = ResourceTracker(host, clock)
    first, second = attempt_of(id=1, reached_peak=1), attempt_of(id=2, reached_peak=1)
    for _ in range(int(HOST_WARMUP_S)):  # the second attempt is first seen 2 s after the first
        tracker.new_pass()
        tracker.fields(first, [os.getpid()], {})
        if clock.now_s >= 1002:
            tracker.fields(second, [os.getpid()], {})
        clock.now_s += 1
    clock.now_s += 2  # both settled now
    due_in_passes = []
    for _ in range(3 * int(HOST_SAMPLE_S)):
        tracker.new_pass()
        due = (tracker.host_due(first), tracker.host_due(second))
        due_in_passes.append(due)
        tracker.fields(first, [os.getpid()], {}, due[0])
        tracker.fields(second, [os.getpid()], {}, due[1])
        clock.now_s += 1
    sampled = [d for d in due_in_passes if any(d)]
    assert sampled == [(True, True)] * len(sampled)  # never one without the other
    assert len(sampled) == 3


def test_attempts_no_longer_live_are_forgotten() -> None:
    host, clock = CountingHost(), Clock()
    tracker = ResourceTracker(host, clock)
    _passes(tracker, clock, reached_peak=1, seconds=HOST_WARMUP_S + 10)
    tracker.keep_only([2])
    host.reads = 0
    _passes(tracker, clock, reached_peak=1, seconds=3)
    assert host.reads == 3  # new again: read at every pass
