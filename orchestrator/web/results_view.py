"""Results per effective config × task for the page and the report: mean ± std over seeds
(through orchestrator.results.aggregate), each seed's value, the val mean and best steps beside
the test mean, every submitted seed accounted for, and the configs × tasks pivot whose bold is
results.selection's choice (on val where reported, never n < 2, lowest for a loss)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.results.aggregate import ResultSummary
from orchestrator.results.collect import NO_METRICS, RunReader
from orchestrator.results.formats import (
    INEXACT,
    cell_marks,
    legend_lines,
    score_line,
    table_lines,
    to_csv,
)
from orchestrator.results.selection import (
    Column,
    ColumnChoice,
    bold_legend,
    choice_notes,
    choose,
    chosen_by,
    is_chosen,
)
from orchestrator.results.table import build_table
from orchestrator.store.db import Store


@dataclass(frozen=True)
class ResultLine:
    suite: str
    config: str
    label: str  # the effective config: config and its --set overrides (effective_config_label)
    task: str
    metric: str
    mean: float | None
    std: float | None  # None for fewer than two values (shown `—`)
    n_seeds: int  # values counted: one per seed (every run when pooled)
    values: tuple[tuple[int, float], ...]  # (seed, value) per run counted, by seed
    levels: str = ""  # the ladder levels its seeds ran at, "0,2 †" when a run went through a rung changing numerics
    overrides: dict[str, Any] = field(default_factory=dict)  # the row's `--set` overrides
    notes: tuple[str, ...] = ()
    marks: str = ""  # the same marks as the CLI's markdown (†, ⊕, §, ¶, ◇, ♯, ‖, *)
    n_text: str = ""  # `3`, or `3 of 4 (seed 4 failed)`
    val_mean: float | None = None
    val_std: float | None = None
    best_steps: str = ""  # each counted run's best_step, by seed
    chosen: bool = False  # its column's choice (bold in the pivot)


@dataclass(frozen=True)
class ResultTable:
    lines: list[ResultLine]
    csv: str
    missing: int  # succeeded jobs whose result.json had no test metrics
    summaries: list[ResultSummary]
    legend: tuple[str, ...] = ()  # what bold means, then one line per mark used (results.formats.LEGEND)
    headline: tuple[str, ...] = ()  # lines about the whole table: pooled, partial
    choices: dict[Column, ColumnChoice] = field(default_factory=dict)  # the CLI's choice per column
    missing_text: str = NO_METRICS  # what `missing` jobs lack, in the CLI's words


def _overrides_text(overrides: Any) -> str:
    if not isinstance(overrides, Mapping) or not overrides:
        return ""
    return " ".join(f"{k}={v}" for k, v in sorted(overrides.items()))


def effective_config_label(summary: Any) -> str:
    """The one adapter to the results row model: "config" or "config [lr=1e-3]" where the row
    names --set overrides (`overrides_label` if the model gives one, else `overrides`)."""
    named = getattr(summary, "label", None)  # ResultSummary.label: overrides and config content
    if isinstance(named, str) and named:
        return named
    label = getattr(summary, "overrides_label", None)
    if not isinstance(label, str) or not label:
        label = _overrides_text(getattr(summary, "overrides", None))
    return f"{summary.config} [{label}]" if label else str(summary.config)


@dataclass(frozen=True)
class PivotCell:
    mean: float | None
    std: float | None
    n: int
    best: bool
    marks: str = ""  # the CLI's marks (†, ⊕, §, ¶, ◇, ♯, ‖, *): see the legend under the table
    n_text: str = ""  # `3`, or `3 of 4 (seed 4 failed)`


@dataclass(frozen=True)
class PivotRow:
    label: str  # suite/config [overrides] when several suites, else config [overrides]
    cells: list[PivotCell | None]  # one per column; None where the config has no run of that task


@dataclass(frozen=True)
class Pivot:
    columns: list[tuple[str, str]]  # (task, metric)
    rows: list[PivotRow]


def pivot(summaries: Sequence[ResultSummary], digits: int = 4,
          choices: dict[Column, ColumnChoice] | None = None) -> Pivot:
    """Effective configs × tasks (as `orch results --format markdown`), each column's choice marked."""
    several_suites = len({s.suite for s in summaries}) > 1
    labels: list[str] = []
    columns: list[tuple[str, str]] = []
    cells: dict[tuple[str, tuple[str, str]], ResultSummary] = {}
    for s in summaries:
        label = effective_config_label(s)
        label = f"{s.suite}/{label}" if several_suites else label
        if label not in labels:
            labels.append(label)
        if (s.task, s.metric) not in columns:
            columns.append((s.task, s.metric))
        cells[(label, (s.task, s.metric))] = s
    order: dict[tuple[str, str], tuple[Any, ...]] = {}
    for s in summaries:
        order.setdefault((s.task, s.metric), (s.task_order, s.task, s.metric))
    columns.sort(key=lambda column: order[column])
    choices = choose(summaries, digits) if choices is None else choices
    rows = []
    for label in labels:
        row: list[PivotCell | None] = []
        for column in columns:
            cell = cells.get((label, column))
            row.append(None if cell is None else PivotCell(
                cell.mean, cell.std, cell.n_seeds, is_chosen(cell, choices),
                "".join(cell_marks(cell)), cell.n_text))
        rows.append(PivotRow(label, row))
    return Pivot(columns, rows)


def result_table(store: Store, cache: RunReader, suite: str | None = None, digits: int = 4) -> ResultTable:
    # the table `orch results` formats (results.table.build_table): one row per effective
    # config, traced to its attempts, so numbers, levels, marks, notes and choices agree with the CLI
    built = build_table(store, suite, digits=digits, reader=cache)
    summaries, choices = built.summaries, built.choices
    lines = [
        ResultLine(s.suite, s.config, effective_config_label(s), s.task, s.metric, s.mean, s.std, s.n_seeds,
                   tuple((run.seed, run.value) for run in s.runs if run.value is not None),
                   ",".join(map(str, s.levels)) + (f" {INEXACT}" if s.inexact_rungs else ""),
                   dict(s.overrides), s.notes, "".join(cell_marks(s)), s.n_text, s.val_mean, s.val_std,
                   " ".join(str(run.best_step) for run in s.runs if run.best_step is not None),
                   is_chosen(s, choices))
        for s in summaries
    ]
    bold = bold_legend(choices, {s.metric for s in summaries})
    with_val = any(s.val_n for s in summaries)  # the page's val cells: said only where there are some
    scores = score_line(with_val, any(s.pooled for s in summaries))
    legend = (scores, *([bold] if bold else []), *choice_notes(choices), *legend_lines(summaries))
    return ResultTable(lines, to_csv(summaries, chosen_by(choices)), built.missing, summaries, legend,
                       tuple(table_lines(summaries)), choices)
