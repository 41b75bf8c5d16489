"""The level that ends soonest, where a queued job could start at more than one. Pure.

A job waits at its ladder level while no card has room for it; a later rung that keeps numbers
bit-equal (checkpointing, no data workers, running alone) may fit now, at a slower pace. The job
starts there when it is expected to end sooner: now + its run time there, against when its own
level is expected to fit (the running attempts' expected ends giving back their memory and
slots) + its run time at its own level. A rung that changes numerics (half batch, `set:`) is
never taken for speed, and nothing moves on a figure not known: a run time at either level, or
when the own level would fit (an attempt in the way with no expected end). When it would fit is
fit_time.fits_at_s, the answer the starvation hold reads too.

The wait is a lower bound: other queued jobs may take the memory first. That favours the job's
own, faster level: a move is made only where even the optimistic wait loses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LevelOption:
    """A later ladder level a queued job could start at instead of its own."""

    level: int
    predicted_peak_mib: int
    expected_duration_s: float | None  # learned (or its own level's × the rung's learned slowdown)
    exact: bool  # every rung from the job's level to this one keeps numbers bit-equal
    run_alone: bool = False


def own_fit_s(per_card: Sequence[float | None]) -> float | None:
    """When the job's own level is expected to fit on any of the cards it waits for: the soonest
    card known; None when no card's wait is known."""
    known = [t for t in per_card if t is not None]
    return min(known) if known else None


def sooner_level(own_expected_s: float | None, own_fit_at_s: float | None, fitting_now: Iterable[LevelOption],
                 now_s: float) -> LevelOption | None:
    """Of the later levels that fit now, the exact one expected to end soonest, where it ends
    before the job's own level would (fitting at `own_fit_at_s`, then running `own_expected_s`);
    None: the job waits at its level."""
    if own_expected_s is None or own_fit_at_s is None:
        return None
    own_end_s = own_fit_at_s + own_expected_s
    best: LevelOption | None = None
    for option in fitting_now:
        if not option.exact or option.expected_duration_s is None:
            continue
        end_s = now_s + option.expected_duration_s
        if end_s < own_end_s and (best is None or end_s < now_s + (best.expected_duration_s or 0.0)):
            best = option
    return best


def move_note(own_level: int, chosen: LevelOption, own_expected_s: float, own_fit_at_s: float,
              now_s: float) -> str:
    """Why the job started at `chosen` (the note `orch show` gives)."""
    if math.isinf(own_fit_at_s):
        waited = f"level {own_level} fits no card until other processes free memory"
    else:
        waited = (f"level {own_level} would wait {_about(own_fit_at_s - now_s)} "
                  f"and run {_about(own_expected_s)}")
    return (
        f"started at level {chosen.level}, an exact rung that fits now and ends sooner "
        f"({_about(chosen.expected_duration_s or 0.0)}): {waited}"
    )


def _about(seconds: float) -> str:
    """`~13 min`; under a minute in seconds (`~40 s`), where minutes would all read `~0 min`."""
    if seconds < 59.5:
        return f"~{max(seconds, 0.0):.0f} s"
    return f"~{seconds / 60:.0f} min"
