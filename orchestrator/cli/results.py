"""`orch results`: test metrics per config × task, mean ± std over seeds, from succeeded jobs."""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from orchestrator.cli.common import db_option, echo_json, open_store
from orchestrator.reconcile import read_result
from orchestrator.results import ResultRow, aggregate, render_rows, to_csv


@click.command("results")
@click.option("--suite", default=None, help="Only this suite.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV.")
@db_option
def results_cmd(suite: str | None, as_json: bool, as_csv: bool, db_path: Path) -> None:
    """Aggregate the succeeded jobs' test metrics over seeds."""
    if as_json and as_csv:
        raise click.UsageError("give at most one of --json and --csv")
    sql = (
        "SELECT j.suite, j.config_name, j.data, j.seed, a.run_dir, a.output_metrics_json FROM jobs j JOIN attempts a "
        "ON a.job_id = j.id AND a.outcome = 'succeeded' WHERE j.state = 'succeeded'"
    )
    params: list[str] = []
    if suite is not None:
        sql += " AND j.suite = ?"
        params.append(suite)
    with open_store(db_path) as store:
        finished = store.query(sql + " ORDER BY j.id", params)
    rows: list[ResultRow] = []
    missing = 0
    for job in finished:
        metrics = job_metrics(read_result(Path(job["run_dir"])), job["output_metrics_json"])
        if metrics is None:
            missing += 1
            continue
        numeric = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        rows.append(ResultRow(job["suite"], job["config_name"], job["data"], job["seed"], numeric))
    summaries = aggregate(rows)
    if as_json:
        echo_json([asdict(s) for s in summaries])
    elif as_csv:
        click.echo(to_csv(summaries), nl=False)
    else:
        table = Table(box=None, header_style="bold")
        for column in ("suite", "config", "task", "metric", "mean ± std", "n", "seeds"):
            table.add_column(column)
        for rendered in render_rows(summaries):
            table.add_row(*rendered)
        Console().print(table)
        if not summaries:
            click.echo("no results yet (only succeeded jobs with test metrics count)")
    if missing and not as_json and not as_csv:
        click.echo(f"{missing} succeeded job(s) had no test metrics (result.json or printed)", err=True)


def job_metrics(result: dict[str, Any] | None, printed_json: str | None) -> dict[str, Any] | None:
    """A job's metrics: result.json's `metrics.test` (or a flat `metrics` of numbers), else what
    its script printed (parsed when the attempt ended); `eval_X` and `test_X` also count as X."""
    metrics: Any = None
    if isinstance(result, dict) and isinstance(result.get("metrics"), dict):
        reported = result["metrics"]
        metrics = reported.get("test") if isinstance(reported.get("test"), dict) else reported
    if not metrics and printed_json:
        with contextlib.suppress(ValueError):
            metrics = json.loads(printed_json)
    if not isinstance(metrics, dict) or not metrics:
        return None
    named = dict(metrics)
    for key, value in metrics.items():
        for prefix in ("test_", "eval_"):
            if isinstance(key, str) and key.startswith(prefix):
                named.setdefault(key[len(prefix):], value)
    return named


def register(group: click.Group) -> None:
    group.add_command(results_cmd)

