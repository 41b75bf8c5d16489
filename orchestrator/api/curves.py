"""Curves as tidy rows (job, attempt, step, key, value), the one implementation behind
`orch curves`, `Sweep.curves()` and the web's charts.

Stitching (pure) makes one curve per job out of its attempts: from the first step an attempt
reported on, a later attempt wins, so a job resumed from a checkpoint reads whole (attempt 1's
steps up to the checkpoint, then attempt 2's), and a job restarted from scratch reads as its
last attempt alone. Where an attempt takes over is a resume point, marked on the charts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.results.formats import csv_lines
from orchestrator.store.db import Store
from orchestrator.store.history import HistoryPoint, iter_history

COLUMNS = ("job", "attempt", "step", "key", "value")


@dataclass(frozen=True)
class TakeOver:
    """Where a later attempt of a job takes over its stitched curve."""

    job: int
    attempt: int
    step: float


def stitch(points: Iterable[HistoryPoint]) -> tuple[list[HistoryPoint], list[TakeOver]]:
    """Per job: each attempt's points before the first step of any later attempt (pure)."""
    by_job: dict[int, dict[int, list[HistoryPoint]]] = {}
    for point in points:
        by_job.setdefault(point.job, {}).setdefault(point.attempt, []).append(point)
    kept: list[HistoryPoint] = []
    takeovers: list[TakeOver] = []
    for job in sorted(by_job):
        attempts = by_job[job]
        order = sorted(attempts)
        first = {n: min(p.step for p in attempts[n]) for n in order}
        for i, n in enumerate(order):
            later = [first[m] for m in order[i + 1:]]
            until = min(later) if later else None
            kept += [p for p in attempts[n] if until is None or p.step < until]
            if i > 0 and (until is None or first[n] < until):
                takeovers.append(TakeOver(job, n, first[n]))
    kept.sort(key=lambda p: (p.job, p.attempt, p.key, p.step))  # as iter_history orders them
    return kept, takeovers


def curve_points(store: Store, *, jobs: Sequence[int] | None = None, suite: str | None = None,
                 keys: Sequence[str] | None = None, stitched: bool = False) -> list[HistoryPoint]:
    """The chosen jobs' history, each attempt apart, or one curve per job when `stitched`."""
    points = list(iter_history(store, jobs=jobs, suite=suite, keys=keys))
    return stitch(points)[0] if stitched else points


def step_value(step: float) -> int | float:
    """A step as written out: a whole number without its `.0`."""
    return int(step) if step == int(step) and abs(step) < 2**53 else step


def point_row(point: HistoryPoint) -> dict[str, int | float | str]:
    row: dict[str, int | float | str] = point._asdict()
    row["step"] = step_value(point.step)
    return row


def as_csv(points: Iterable[HistoryPoint]) -> str:
    """CSV with a header; keys (text a worker chose) through the results' spreadsheet-safe cell."""
    return csv_lines(COLUMNS, ([p.job, p.attempt, step_value(p.step), p.key, p.value] for p in points))


def as_json(points: Iterable[HistoryPoint]) -> str:
    return json.dumps([point_row(p) for p in points], separators=(",", ":"))
