"""Results per config × task for the page and the report: mean ± std over seeds (through
orchestrator.results) and each seed's value, from the succeeded attempts' result.json."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from orchestrator.results import ResultRow, aggregate
from orchestrator.results_format import to_csv
from orchestrator.results_source import finite_metrics, job_metrics
from orchestrator.runfiles import read_result
from orchestrator.store.db import Store
from orchestrator.store.queries import succeeded_attempts


@dataclass(frozen=True)
class ResultLine:
    suite: str
    config: str
    task: str
    metric: str
    mean: float | None
    std: float
    n_seeds: int
    values: tuple[tuple[int, float], ...]  # (seed, value), by seed


@dataclass(frozen=True)
class ResultTable:
    lines: list[ResultLine]
    csv: str
    missing: int  # succeeded jobs whose result.json had no test metrics


class MetricsCache:
    """A succeeded attempt's result.json does not change, so each is read once per process."""

    def __init__(self, max_entries: int = 200_000) -> None:
        self._metrics: dict[str, dict[str, float] | None] = {}
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def test_metrics(self, run_dir: str, printed_json: str | None = None) -> dict[str, float] | None:
        with self._lock:
            if run_dir in self._metrics:
                return self._metrics[run_dir]
        test = job_metrics(read_result(Path(run_dir)), printed_json)
        numeric = finite_metrics(test) if test is not None else None
        with self._lock:
            if len(self._metrics) >= self.max_entries:
                self._metrics.clear()
            if numeric is not None:  # a missing file may still appear: read it again next time
                self._metrics[run_dir] = numeric
        return numeric


def result_table(store: Store, cache: MetricsCache, suite: str | None = None) -> ResultTable:
    rows: list[ResultRow] = []
    missing = 0
    for run in succeeded_attempts(store, suite):
        metrics = cache.test_metrics(run.run_dir, run.output_metrics_json)
        if metrics is None:
            missing += 1
            continue
        rows.append(ResultRow(run.suite, run.config, run.data, run.seed, metrics))
    summaries = aggregate(rows)
    lines = [
        ResultLine(s.suite, s.config, s.task, s.metric, s.mean, s.std, s.n_seeds,
                   tuple((run.seed, run.value) for run in s.runs if run.value is not None))
        for s in summaries
    ]
    return ResultTable(lines, to_csv(summaries), missing)
