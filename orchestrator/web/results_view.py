"""Results per effective config × task for the page and the report: mean ± std over seeds
(through orchestrator.results) and each run's value, from the succeeded attempts' result.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.results import aggregate
from orchestrator.results_format import cell_marks, legend_lines, to_csv
from orchestrator.results_source import RunReader, collect_rows
from orchestrator.store.db import Store

# A succeeded attempt's result.json does not change, so each is read once per process.
MetricsCache = RunReader


@dataclass(frozen=True)
class ResultLine:
    suite: str
    config: str
    task: str
    metric: str
    mean: float | None
    std: float
    n_seeds: int  # runs counted (a seed that ran twice counts twice)
    values: tuple[tuple[int, float], ...]  # (seed, value) per run counted, by seed
    overrides: dict[str, Any] = field(default_factory=dict)  # the row's `--set` overrides
    label: str = ""  # config with its overrides: `r8 [learning_rate=0.001]`
    notes: tuple[str, ...] = ()
    marks: str = ""  # the same marks as the CLI's markdown (†, ‡, §, *)


@dataclass(frozen=True)
class ResultTable:
    lines: list[ResultLine]
    csv: str
    missing: int  # succeeded jobs whose result.json had no test metrics
    legend: tuple[str, ...] = ()  # one line per mark used (results_format.LEGEND)


def result_table(store: Store, cache: MetricsCache, suite: str | None = None) -> ResultTable:
    rows, missing = collect_rows(store, suite, cache)
    summaries = aggregate(rows)
    lines = [
        ResultLine(s.suite, s.config, s.task, s.metric, s.mean, s.std, s.n,
                   tuple((run.seed, run.value) for run in s.runs if run.value is not None),
                   dict(s.overrides), s.label, s.notes, "".join(cell_marks(s)))
        for s in summaries
    ]
    return ResultTable(lines, to_csv(summaries), missing, tuple(legend_lines(summaries)))
