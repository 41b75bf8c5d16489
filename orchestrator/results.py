"""Aggregates worker results over seeds: one summary per (suite, config, task). Pure: no I/O.

The primary metric follows the GLUE convention for the task: Matthews correlation for CoLA,
F1 for MRPC and QQP, accuracy for the rest; where the runs of a group report no accuracy (a
script's own task and metrics), the first metric they report.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

PRIMARY_METRICS = {"cola": "mcc", "mrpc": "f1", "qqp": "f1"}
DEFAULT_METRIC = "accuracy"
CSV_COLUMNS = ("suite", "config", "task", "metric", "mean", "std", "n_seeds", "seeds")
_TASK = re.compile(r"^[a-z0-9-]+_([a-z0-9]+?)(?:_\d+)?$")


@dataclass(frozen=True)
class ResultRow:
    suite: str
    config: str
    task: str  # the data name as submitted, e.g. "glue-tvt_qnli"
    seed: int
    metrics: Mapping[str, float]  # the "test" metrics of one result.json


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
    groups: dict[tuple[str, str, str], dict[int, float | None]] = {}
    for row in rows:
        metric = chosen.get((row.suite, row.config, row.task), primary_metric(row.task))
        value = row.metrics.get(metric)
        # A repeated seed (a retried job) counts once: the last value seen wins.
        groups.setdefault((row.suite, row.config, row.task), {})[row.seed] = (
            None if value is None else float(value)
        )
    summaries = []
    for (suite, config, task), by_seed in sorted(groups.items()):
        seeds = tuple(sorted(seed for seed, value in by_seed.items() if value is not None))
        values = [by_seed[seed] for seed in seeds]
        mean = sum(v for v in values if v is not None) / len(values) if values else None
        std = 0.0
        if mean is not None and len(values) > 1:
            std = math.sqrt(
                sum((v - mean) ** 2 for v in values if v is not None) / (len(values) - 1)
            )
        metric = chosen.get((suite, config, task), primary_metric(task))
        summaries.append(
            ResultSummary(suite, config, task, metric, mean, std, len(seeds), seeds)
        )
    return summaries


def render_rows(summaries: Iterable[ResultSummary], digits: int = 4) -> list[list[str]]:
    """Plain string rows (no header) for a table: suite, config, task, metric, mean ± std, n, seeds."""
    rows = []
    for s in summaries:
        score = "—" if s.mean is None else f"{s.mean:.{digits}f} ± {s.std:.{digits}f}"
        seeds = " ".join(str(seed) for seed in s.seeds)
        rows.append([s.suite, s.config, s.task, s.metric, score, str(s.n_seeds), seeds])
    return rows


def to_csv(summaries: Iterable[ResultSummary]) -> str:
    """CSV with a header row (CSV_COLUMNS); seeds space-separated; empty mean when missing."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for s in summaries:
        mean = "" if s.mean is None else repr(s.mean)
        seeds = " ".join(str(seed) for seed in s.seeds)
        writer.writerow([s.suite, s.config, s.task, s.metric, mean, repr(s.std), s.n_seeds, seeds])
    return buffer.getvalue()
