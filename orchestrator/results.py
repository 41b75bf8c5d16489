"""Aggregates worker results over seeds: one summary per (suite, config, task). Pure: no I/O.

The primary metric follows the GLUE convention for the task: Matthews correlation for CoLA,
F1 for MRPC and QQP, accuracy for the rest; where the runs of a group report no accuracy (a
script's own task and metrics), the first metric they report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PRIMARY_METRICS = {"cola": "mcc", "mrpc": "f1", "qqp": "f1"}
DEFAULT_METRIC = "accuracy"
_TASK = re.compile(r"^[a-z0-9-]+_([a-z0-9]+?)(?:_\d+)?$")


@dataclass(frozen=True)
class ResultRow:
    suite: str
    config: str
    task: str  # the data name as submitted, e.g. "glue-tvt_qnli"
    seed: int
    metrics: Mapping[str, float]  # the "test" metrics of one result.json
    # Where the value came from, so every cell can be traced to the attempt that made it.
    job: int | None = None
    attempt: int | None = None
    level: int | None = None  # ladder level the succeeding attempt ran at
    step: str | None = None  # that level's rung name
    changes: Mapping[str, Any] = field(default_factory=dict)  # every ladder override vs. the config
    run_alone: bool = False


@dataclass(frozen=True)
class SeedRun:
    """One seed of a summary: its value and the attempt (and ladder level) that produced it."""

    seed: int
    value: float | None
    job: int | None
    attempt: int | None
    level: int | None
    step: str | None
    changes: Mapping[str, Any]
    run_alone: bool


@dataclass(frozen=True)
class ResultSummary:
    suite: str
    config: str
    task: str
    metric: str
    mean: float | None  # None when no seed reported the metric
    std: float  # sample standard deviation; 0.0 for fewer than two seeds
    n_seeds: int
    seeds: tuple[int, ...]
    runs: tuple[SeedRun, ...] = ()  # one per seed with a value, in seed order

    @property
    def levels(self) -> tuple[int, ...]:
        """The distinct ladder levels this cell's seeds ran at (host steps count as a change)."""
        return tuple(sorted({r.level for r in self.runs if r.level is not None}))

    @property
    def mixed_levels(self) -> bool:
        """True when the seeds did not all run with the same settings: a reader must know."""
        shapes = {(r.level, tuple(sorted((k, repr(v)) for k, v in r.changes.items())), r.run_alone) for r in self.runs}
        return len(shapes) > 1


def primary_metric(task: str) -> str:
    """`glue-tvt_mrpc_1000` -> "f1"; unknown names fall back to accuracy."""
    match = _TASK.match(task.lower())
    base = match.group(1) if match else task.lower()
    return PRIMARY_METRICS.get(base, DEFAULT_METRIC)


def aggregate(rows: Iterable[ResultRow]) -> list[ResultSummary]:
    """Mean and sample std of each group's primary metric, sorted by (suite, config, task)."""
    rows = list(rows)
    chosen: dict[tuple[str, str, str], str] = {}
    for row in rows:  # accuracy, else (a script's own task) the first metric its runs report
        group = (row.suite, row.config, row.task)
        primary = primary_metric(row.task)
        if primary != DEFAULT_METRIC or chosen.get(group) == primary:
            continue
        if primary in row.metrics:
            chosen[group] = primary
        elif group not in chosen and row.metrics:
            chosen[group] = next(iter(row.metrics))
    groups: dict[tuple[str, str, str], dict[int, ResultRow]] = {}
    for row in rows:
        # A repeated seed (a retried job) counts once: the last row seen wins.
        groups.setdefault((row.suite, row.config, row.task), {})[row.seed] = row
    summaries = []
    for (suite, config, task), by_seed in sorted(groups.items()):
        metric = chosen.get((suite, config, task), primary_metric(task))
        values: dict[int, float] = {}
        for seed, row in by_seed.items():
            value = row.metrics.get(metric)
            if value is not None:
                values[seed] = float(value)
        seeds = tuple(sorted(values))
        mean = sum(values[s] for s in seeds) / len(seeds) if seeds else None
        std = 0.0
        if mean is not None and len(seeds) > 1:
            std = math.sqrt(sum((values[s] - mean) ** 2 for s in seeds) / (len(seeds) - 1))
        runs = tuple(
            SeedRun(
                seed=seed, value=values[seed], job=by_seed[seed].job, attempt=by_seed[seed].attempt,
                level=by_seed[seed].level, step=by_seed[seed].step, changes=dict(by_seed[seed].changes),
                run_alone=by_seed[seed].run_alone,
            )
            for seed in seeds
        )
        summaries.append(ResultSummary(suite, config, task, metric, mean, std, len(seeds), seeds, runs))
    return summaries
