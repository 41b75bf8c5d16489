"""The accounted results table, built once for every view: `orch results` (every format), the
web's results page, `orch report`, `Sweep.summary()` and `Sweep.results()` all format this.

It holds every submitted job as a ResultRow (results.collect: numbers stored at each attempt's
end, never a run dir reopened), the rows (results.aggregate: one per effective setting × task,
one value per seed, every seed accounted for) and each column's choice (results.selection)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.errors import UsageError
from orchestrator.lifecycle import JobState
from orchestrator.plans.spelling import did_you_mean
from orchestrator.results.aggregate import ResultRow, ResultSummary, aggregate
from orchestrator.results.collect import RunReader, collect_rows
from orchestrator.results.filters import Where, apply_where
from orchestrator.results.run_lines import RunLine, run_lines
from orchestrator.results.seeds import SeedStatus
from orchestrator.results.selection import Basis, Column, ColumnChoice, choose
from orchestrator.store.db import Store


@dataclass(frozen=True)
class ResultsTable:
    """Every view's one source: the jobs (`rows`), the summaries and the choices made on them."""

    rows: list[ResultRow]  # every submitted job the filters keep
    summaries: list[ResultSummary]  # one per effective setting × task, in suite order
    choices: dict[Column, ColumnChoice]
    missing: int  # the summaries' seeds whose deciding run succeeded with no usable test metrics (no_metric_jobs)
    from_run_dirs: int = 0  # attempts read from their run dirs (ended before readings were stored)
    printed_splits: bool = False  # some run's printed eval_*/test_* were read as val and test

    def lines(self) -> list[RunLine]:
        """One line per setting × task × seed run × split × metric (results.run_lines)."""
        return run_lines(self.rows, self.summaries)


def build_table(
    store: Store,
    suite: str | None = None,
    *,
    metric: str | None = None,
    pooled: bool = False,
    where: Sequence[Where] = (),
    digits: int = 4,
    select: Basis | None = None,
    reader: RunReader | None = None,
) -> ResultsTable:
    collected = collect_rows(store, suite, reader)
    rows = apply_where(collected.rows, where)
    if metric is not None:
        check_metric_reported(rows, metric)
    summaries = aggregate(rows, metric=metric, pooled=pooled)
    return ResultsTable(
        rows,
        summaries,
        choose(summaries, digits, select),
        no_metric_jobs(rows, summaries),
        collected.from_run_dirs,
        collected.printed_splits,
    )


def check_metric_reported(rows: Sequence[ResultRow], metric: str) -> None:
    """Refuse a metric no run reported (on either split, a non-finite value included) where runs
    reported others: a misspelt `--metric acuracy` showed every seed as reporting none, blaming
    the runs. Every name is taken before any run reported a metric, while a run has not ended (a
    task's own metric may come with it), and for a split's name of a reported metric (`val_loss`:
    the table's note says where each split is)."""
    if any(r.state in (JobState.QUEUED, JobState.RUNNING) for r in rows):
        return
    reported = {name for r in rows for found in (r.metrics, r.val_metrics, r.nonfinite, r.val_nonfinite)
                for name in found}
    bare = metric.split("_", 1)[1] if metric.startswith(("val_", "eval_", "test_")) else metric
    if reported and metric not in reported and bare not in reported:
        shown = sorted(reported)
        more = len(shown) - MAX_LISTED
        listed = ", ".join(shown[:MAX_LISTED]) + (f" and {more} more" if more > 0 else "")
        raise UsageError(f"metric {metric!r}: no run here reported it{did_you_mean([metric], shown)} "
                         f"(reported: {listed})")


MAX_LISTED = 20  # metric names an error lists


def no_metric_jobs(rows: Sequence[ResultRow], summaries: Sequence[ResultSummary]) -> int:
    """How many succeeded jobs reported no usable test metrics, among the runs that decide a seed
    of `summaries` (seeds.deciding_run): a run replaced by a later run of its seed is not
    counted, nor a job of a row not shown (--where, --select)."""
    deciding = {state.job for s in summaries for state in s.seed_states if state.status is SeedStatus.NO_METRIC}
    return len({r.job for r in rows if r.job is not None and r.job in deciding and r.no_metrics is not None})
