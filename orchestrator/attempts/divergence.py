"""Divergence: whether a run's training loss ended above where it began. Pure: losses in, verdict out.

A run diverged when the mean loss of its end (its last epoch; for a run of one epoch and for a
script's own output, its last readings) is not finite, exceeds the mean of its first steps by more than
FIRST_STEPS_MARGIN of it (a run whose loss never moved ends a little either side of its start by
noise alone: 4.411 against 4.405 is not a divergence), or exceeds `factor` × its minimum (the
lowest mean over a window of consecutive steps, so one lucky batch is not the minimum). Our LoRA worker
summarises its per-step losses with `summarise_losses`; for any other script orch feeds the
losses it parsed from the output to a `LossTrack`, and every worker's reported history of `loss`
(progress.jsonl, printed log dicts) is summarised too. Each gives a `LossSummary`, judged by
`verdict`; a run is flagged when any of them says it diverged.

The standard library only: the LoRA worker imports this module.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_FACTOR = 3.0  # k: a last epoch above k × the minimum diverged
MAX_WINDOW = 10  # steps averaged for the first steps, the minimum and a script's last readings
FIRST_STEPS_MARGIN = 0.05  # of |the first steps' mean|: a last epoch this close above it is a flat run's noise


@dataclass(frozen=True)
class LossSummary:
    """The three losses the rule compares, each a mean over a few steps; None where unknown."""

    initial: float | None  # the first steps'
    minimum: float | None  # the lowest window's
    final: float | None  # the last epoch's (a script's: its last readings'); None when not finite
    steps: int  # losses seen
    final_steps: int  # of which the final mean is made
    nonfinite: bool = False  # a NaN or infinite loss in the final part

    def to_record(self) -> dict[str, Any]:
        return {"initial": self.initial, "minimum": self.minimum, "final": self.final, "steps": self.steps,
                "final_steps": self.final_steps, "nonfinite": self.nonfinite}


def window_for(steps: int) -> int:
    """Steps per window: a tenth of the run, 1 to MAX_WINDOW."""
    return min(MAX_WINDOW, max(1, steps // 10))


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _finite(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _min_window_mean(losses: Sequence[float], window: int) -> float | None:
    best: float | None = None
    for start in range(0, max(1, len(losses) - window + 1)):
        part = losses[start : start + window]
        if part and all(_finite(v) for v in part):
            mean = sum(part) / len(part)
            best = mean if best is None else min(best, mean)
    return best


def summarise_losses(losses: Sequence[float], final_steps: int | None = None) -> LossSummary:
    """A run's per-step losses; `final_steps`: how many of the last ones make its last epoch
    (None: the last window). A last epoch that is the whole run is its descent too: such a run's
    end is its last window (judged on the whole epoch, a loss that fell from 5 to 5e-5 in one
    epoch averaged 0.22 and read as diverged, above 3 × its minimum)."""
    if not losses:
        return LossSummary(None, None, None, 0, 0)
    window = window_for(len(losses))
    whole_run = final_steps is not None and final_steps >= len(losses)
    last = max(1, min(len(losses), final_steps if final_steps and not whole_run else window))
    first = [v for v in losses[:window] if _finite(v)]
    tail = losses[-last:]
    nonfinite = not all(_finite(v) for v in tail)
    return LossSummary(_mean(first), _min_window_mean(losses, window), None if nonfinite else _mean(tail),
                       len(losses), last, nonfinite)


# Up to this many losses a track keeps them all and summarises them as `summarise_losses` does
# (a window of a tenth of the run): a short run's first and last readings are not one window.
# From here on a window is MAX_WINDOW either way.
EXACT_UP_TO = 10 * MAX_WINDOW


class LossTrack:
    """Losses read one at a time from a script's output, kept in bounded memory: the first
    window, the running minimum of window means and the last window (O(1) per loss); the first
    EXACT_UP_TO losses whole, so a short run is judged as `summarise_losses` judges it."""

    def __init__(self, window: int = MAX_WINDOW) -> None:
        self.window = window
        self.early: list[float] = []  # the first EXACT_UP_TO losses
        self.first: list[float] = []
        self.last: deque[float] = deque(maxlen=window)
        self.minimum: float | None = None
        self.steps = 0
        self._sum = 0.0  # of the finite losses in `last`
        self._nonfinite = 0  # how many in `last` are not

    def add(self, loss: float) -> None:
        self.steps += 1
        if len(self.early) < EXACT_UP_TO:
            self.early.append(loss)
        finite = _finite(loss)
        if len(self.first) < self.window and finite:
            self.first.append(loss)
        if len(self.last) == self.window:  # the oldest leaves the window
            old = self.last[0]
            if _finite(old):
                self._sum -= old
            else:
                self._nonfinite -= 1
        self.last.append(loss)
        if finite:
            self._sum += loss
        else:
            self._nonfinite += 1
        if self.steps % 1000 == 0:  # a running sum drifts: add the window up again now and then
            self._sum = sum(v for v in self.last if _finite(v))
        if len(self.last) == self.window and not self._nonfinite:
            mean = self._sum / self.window
            self.minimum = mean if self.minimum is None else min(self.minimum, mean)

    def summary(self) -> LossSummary:
        if self.steps <= len(self.early):  # a short run: every loss is at hand
            return summarise_losses(self.early)
        tail = list(self.last)
        nonfinite = not all(_finite(v) for v in tail)
        minimum = self.minimum
        if minimum is None and tail and not nonfinite:  # fewer readings than a window
            minimum = sum(tail) / len(tail)
        return LossSummary(_mean(self.first), minimum, None if nonfinite or not tail else _mean(tail),
                           self.steps, len(tail), nonfinite)


def verdict(summary: LossSummary, factor: float | None = DEFAULT_FACTOR) -> str | None:
    """Why the run diverged, in words; None when it did not (or nothing is known)."""
    if summary.steps == 0:
        return None
    if summary.nonfinite:
        return "loss not finite at the end of training"
    final, initial, minimum = summary.final, summary.initial, summary.minimum
    if final is None:
        return None
    if initial is not None and final - initial > FIRST_STEPS_MARGIN * abs(initial):
        return f"final loss {final:.4g} above the first steps' {initial:.4g}"
    if factor is not None and minimum is not None and minimum > 0 and final > factor * minimum:
        return f"final loss {final:.4g} above {factor:g} × its minimum {minimum:.4g}"
    return None


def summary_from_record(record: Any) -> LossSummary | None:
    """A `loss_summary` mapping from result.json (user code's file): None unless it has the
    shape `LossSummary.to_record` writes, with finite numbers or nulls."""
    if not isinstance(record, Mapping):
        return None
    values: dict[str, float | None] = {}
    for key in ("initial", "minimum", "final"):
        raw = record.get(key)
        if raw is None:
            values[key] = None
        elif isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(raw):
            values[key] = float(raw)
        else:
            return None
    steps, final_steps, nonfinite = record.get("steps"), record.get("final_steps"), record.get("nonfinite", False)
    if not (isinstance(steps, int) and isinstance(final_steps, int) and isinstance(nonfinite, bool)):
        return None
    if isinstance(steps, bool) or isinstance(final_steps, bool) or not 0 <= final_steps <= steps < 10**12:
        return None
    return LossSummary(values["initial"], values["minimum"], values["final"], steps, final_steps, nonfinite)
