"""The one clock where time is policy: hang timeouts, crash-loop windows, the head-of-line
hold, Slurm poll backoff, kill grace. Passed in (the daemon holds one, the store carries it) so
tests move time instead of waiting for it.

Two readings: `now_s` is wall time (seconds since the epoch, what state.db stores and what
progress files are stamped with); `monotonic_s` never goes back, for intervals kept in memory.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float:
        """Wall time, seconds since the epoch."""
        ...

    def monotonic_s(self) -> float:
        """Seconds from an arbitrary start; never goes back."""
        ...


class SystemClock:
    """The machine's clocks."""

    def now_s(self) -> float:
        return time.time()

    def monotonic_s(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK: Clock = SystemClock()


class FakeClock:
    """A clock that stands still until `advance` moves it. Starts at the machine's wall time by
    default, so rows and files stamped in real time while a test runs read as just written."""

    def __init__(self, start_s: float | None = None) -> None:
        self._wall_s = time.time() if start_s is None else float(start_s)
        self._mono_s = 1000.0  # arbitrary, like time.monotonic's own start

    def now_s(self) -> float:
        return self._wall_s

    def monotonic_s(self) -> float:
        return self._mono_s

    def step_wall(self, seconds: float) -> None:
        """Move wall time alone, either way, as NTP, `date -s` or a VM resume does; the
        monotonic reading stays where it is."""
        self._wall_s += seconds

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock never goes back ({seconds} s)")
        self._wall_s += seconds
        self._mono_s += seconds
