"""Curves (pure where it can be): every metric an attempt reported against step, from its
history in the database (store.history; progress.jsonl for attempts from before it was kept),
runs overlaid, and the seeds of one effective config as a band (mean, min and max at each step).
Each run carries its resume points (where a later attempt took over) and a row of the legend
table the page draws, with a toggle per run.

progress.jsonl is written by user code: read bounded through attempts.rundir_reads' run-dir descent (no
symlink followed), each line a JSON mapping or skipped, values finite numbers or dropped,
metric names short text, at most MAX_METRICS of them."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.attempts.rundir_reads import CURVE_TAIL_BYTES, MAX_CURVE_POINTS
from orchestrator.executors.runs_tree import FileProblem, RunTreeError, open_run_dir, read_file
from orchestrator.rundir_files import RunDir
from orchestrator.store.history import HistoryPoint
from orchestrator.store.history_bounds import downsample
from orchestrator.web.templating import Sent
from orchestrator.wording import MAX_METRIC

NOT_METRICS = frozenset({"t", "ts", "time", "step", "total", "epoch"})
MAX_METRICS = 24
MAX_NAME_CHARS = 64
# Attempts and runs are told apart by these; none is the OOM red of the timeline.
PALETTE = ("#3b7dd8", "#2e9d5b", "#8e6bd8", "#e07b00", "#1fa2a8", "#b05fc4", "#6b8e23", "#5c7cfa",
           "#a0522d", "#2b8cbe", "#c71585", "#708090")


@dataclass(frozen=True)
class Curve:
    steps: list[float]
    values: list[float]


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value) if abs(value) <= MAX_METRIC else math.inf
    return number if math.isfinite(number) else None


def _thin(points: list[tuple[float, float]], limit: int) -> list[tuple[float, float]]:
    if len(points) <= limit:
        return points
    stride = math.ceil(len(points) / limit)
    return points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])


def parse_curves(text: str, max_points: int = MAX_CURVE_POINTS) -> dict[str, Curve]:
    """Metric name -> its (step, value) points, from progress.jsonl's text (pure)."""
    points: dict[str, list[tuple[float, float]]] = {}
    for line in text.splitlines():
        try:
            record = json.loads(line, parse_constant=lambda token: None)
        except (ValueError, RecursionError):
            continue  # a partial first line, or a line being written
        if not isinstance(record, dict):
            continue
        step = _finite(record.get("step"))
        if step is None:
            continue
        for name, raw in record.items():
            if not isinstance(name, str) or name in NOT_METRICS or len(name) > MAX_NAME_CHARS:
                continue
            value = _finite(raw)
            if value is None or (name not in points and len(points) >= MAX_METRICS):
                continue
            points.setdefault(name, []).append((step, value))
    curves = {}
    for name in sorted(points, key=lambda n: (n != "loss", n)):  # loss first, then by name
        thinned = _thin(points[name], max_points)
        curves[name] = Curve([s for s, _ in thinned], [v for _, v in thinned])
    return curves


def curves_of(points: Iterable[HistoryPoint], max_points: int = MAX_CURVE_POINTS) -> dict[str, Curve]:
    """Metric name -> its curve, from history points (of one run, sorted by step), thinned with
    their minima and maxima kept; loss first, then by name (pure)."""
    by_key: dict[str, list[tuple[float, float]]] = {}
    for point in points:
        by_key.setdefault(point.key, []).append((point.step, point.value))
    curves = {}
    for name in sorted(by_key, key=lambda n: (n != "loss", n))[:MAX_METRICS]:
        kept = downsample(sorted(by_key[name]), max_points)
        curves[name] = Curve([s for s, _ in kept], [v for _, v in kept])
    return curves


def read_curves(run_dir: str | Path, max_points: int = MAX_CURVE_POINTS) -> dict[str, Curve]:
    try:
        with open_run_dir(Path(run_dir)) as dir_fd:
            raw = read_file(dir_fd, RunDir.PROGRESS, CURVE_TAIL_BYTES, tail=True)
    except (FileNotFoundError, FileProblem, RunTreeError, OSError):
        return {}
    return parse_curves((raw or b"").decode("utf-8", errors="replace"), max_points)


@dataclass(frozen=True)
class Run:
    """One line of a curves chart: a job's attempt (or its latest), and the group its band joins."""

    key: str
    label: str
    group: str  # runs of one group are seeds of one effective config
    curves: dict[str, Curve]
    colour: str = PALETTE[0]
    dash: list[int] = field(default_factory=list)
    marks: list[float] = field(default_factory=list)  # steps where a later attempt took over (resumed)
    cells: dict[str, str] = field(default_factory=dict)  # its row of the legend table, by column
    href: str | None = None  # its job page
    seed: int | None = None  # a job's seed: a band counts each seed once
    job: int | None = None
    succeeded: bool = False
    pruned: PrunedAt | None = None  # where early stopping stopped it: a ✕ at its last point


@dataclass(frozen=True)
class PrunedAt:
    step: float | None  # the step of its prune record (None where the record has none)
    why: str  # "pruned at step 400 (val_accuracy 0.52, ranked 7 of 9 at that step; asha)"


@dataclass(frozen=True)
class SeedBand:
    label: str
    colour: str
    n: int
    steps: list[float]
    mean: list[float]
    lo: list[float]
    hi: list[float]


def _at(curve: Curve, step: float) -> float | None:
    """The curve's value at `step`, linear between its points; None outside its range."""
    xs = curve.steps
    if not xs or step < xs[0] or step > xs[-1]:
        return None
    lo, hi = 0, len(xs) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if xs[mid] <= step:
            lo = mid
        else:
            hi = mid
    if xs[lo] == step or hi == lo:
        return curve.values[lo]
    if xs[hi] == step:
        return curve.values[hi]
    w = (step - xs[lo]) / (xs[hi] - xs[lo])
    return curve.values[lo] * (1 - w) + curve.values[hi] * w


def seed_bands(runs: Sequence[Run], metric: str) -> list[SeedBand]:
    """Per group with the metric: mean, min and max over its seeds at every step any of them
    logged, counting at each step only the runs whose range covers it (no extrapolation). A seed
    counts once, as in the results table: its latest succeeded job, else its latest job (a
    `--force` rerun replaces the earlier run, never adds a seed); n is the seeds counted."""
    groups: dict[str, list[Run]] = {}
    for run in per_seed(runs):
        if metric in run.curves and run.curves[metric].steps:
            groups.setdefault(run.group, []).append(run)
    bands = []
    for i, (group, members) in enumerate(groups.items()):
        steps = sorted({s for r in members for s in r.curves[metric].steps})
        kept_steps, mean, lo, hi = [], [], [], []
        for step in steps:
            values = [v for v in (_at(r.curves[metric], step) for r in members) if v is not None]
            if not values:
                continue
            kept_steps.append(step)
            mean.append(sum(values) / len(values))
            lo.append(min(values))
            hi.append(max(values))
        bands.append(SeedBand(group, PALETTE[i % len(PALETTE)], len(members), kept_steps, mean, lo, hi))
    return bands


def per_seed(runs: Sequence[Run]) -> list[Run]:
    """One run per (group, seed): the latest succeeded job of the seed, else its latest job;
    runs without a seed are each kept. In the order given."""
    chosen: dict[tuple[str, int], Run] = {}
    for run in runs:
        if run.seed is None:
            continue
        key = (run.group, run.seed)
        held = chosen.get(key)
        rank = (run.succeeded, -1 if run.job is None else run.job)
        if held is None or rank > (held.succeeded, -1 if held.job is None else held.job):
            chosen[key] = run
    kept = {id(run) for run in chosen.values()}
    return [run for run in runs if run.seed is None or id(run) in kept]


def chart_spec(runs: Sequence[Run], *, key: str, metric: str = "loss", smooth: float = 0.0, log: bool = False,
               band: bool = False, with_bands: bool = True, empty: str = "no curve reported yet",
               columns: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON the page's curves chart draws (static/charts.js); `columns` name the legend
    table's columns (each run's `cells`), after its toggle and colour."""
    metrics: list[str] = []
    for run in runs:
        metrics += [m for m in run.curves if m not in metrics]
    metrics.sort(key=lambda m: (m != "loss", m))
    # metric names are identifiers the page sends back (the address names the metric drawn): kept as
    # reported (Sent); `labels` gives each the text a person reads
    spec: dict[str, Any] = {
        "key": key, "metric": Sent(metric), "metrics": [Sent(m) for m in metrics],
        "labels": {Sent(m): m for m in metrics}, "smooth": smooth, "log": log, "band": band, "empty": empty,
        "columns": list(columns),
        "runs": [{"key": r.key, "label": r.label, "group": r.group, "colour": r.colour, "dash": r.dash or None,
                  "marks": r.marks, "cells": [r.cells.get(c, "") for c in columns], "href": r.href,
                  "pruned": {"step": r.pruned.step, "why": r.pruned.why} if r.pruned else None,
                  "curves": {Sent(m): [c.steps, c.values] for m, c in r.curves.items()}} for r in runs],
    }
    if with_bands:
        spec["bands"] = {Sent(m): [{"label": b.label, "colour": b.colour, "n": b.n, "steps": b.steps, "mean": b.mean,
                              "lo": b.lo, "hi": b.hi} for b in seed_bands(runs, m)] for m in metrics}
    return spec
