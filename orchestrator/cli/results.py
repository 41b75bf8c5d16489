"""`orch results`: test metrics per effective config (config + `--set` overrides) × task, mean ±
std over seeds, from succeeded jobs."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from orchestrator.cli.common import db_option, echo_json, open_store
from orchestrator.errors import UsageError
from orchestrator.results.aggregate import ResultSummary, aggregate
from orchestrator.results.collect import collect_rows
from orchestrator.results.formats import (
    FORMATS,
    TABLE_COLUMNS,
    legend_lines,
    render_rows,
    to_csv,
    to_records,
)
from orchestrator.results.grids import to_latex, to_markdown
from orchestrator.store.queries import suite_names


@click.command("results")
@click.option("--suite", default=None, help="Only this suite.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="table (default), csv, markdown or latex (configs × tasks, best in bold), json.")
@click.option("--digits", type=click.IntRange(0, 10), default=4, show_default=True,
              help="Decimals shown in table, markdown and latex output.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: every row with its overrides and each run's job, attempt and ladder level.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV (same as --format csv).")
@db_option
def results_cmd(suite: str | None, fmt: str | None, digits: int, as_json: bool, as_csv: bool, db_path: Path) -> None:
    """Aggregate the succeeded jobs' test metrics over seeds: one row per effective config
    (config and its --set overrides) × task, every succeeded run counted."""
    chosen = {f for f, flag in (("json", as_json), ("csv", as_csv)) if flag} | ({fmt} if fmt else set())
    if len(chosen) > 1:
        raise click.UsageError("give one output format (--format, --json or --csv)")
    fmt = chosen.pop() if chosen else "table"
    with open_store(db_path) as store:
        if suite is not None:
            known = suite_names(store)
            if suite not in known:
                raise UsageError(
                    f"unknown suite {suite!r} in {db_path} (its suites: {', '.join(known) or 'none yet'})"
                )
        rows, missing = collect_rows(store, suite)
    summaries = aggregate(rows)
    if fmt == "json":
        echo_json(to_records(summaries))
    elif fmt == "csv":
        click.echo(to_csv(summaries), nl=False)
    elif fmt == "markdown":
        click.echo(to_markdown(summaries, digits), nl=False)
    elif fmt == "latex":
        click.echo(to_latex(summaries, digits), nl=False)
    else:
        _print_table(summaries, digits)
    if missing and fmt != "json":
        click.echo(f"{missing} succeeded job(s) had no test metrics (result.json or printed)", err=True)


def _print_table(summaries: list[ResultSummary], digits: int) -> None:
    if not summaries:
        click.echo("no results yet (only succeeded jobs with test metrics count)")
        return
    rendered = render_rows(summaries, digits)
    # Columns that say nothing in this table (no overrides, no levels known, no notes) are left out.
    shown = [i for i, name in enumerate(TABLE_COLUMNS)
             if name not in ("overrides", "levels", "notes") or any(row[i] not in ("", "-") for row in rendered)]
    table = Table(box=None, header_style="bold")
    for i in shown:
        table.add_column(TABLE_COLUMNS[i], overflow="fold")
    for row in rendered:
        table.add_row(*(row[i] for i in shown))
    console = Console()
    if not console.is_terminal:
        console = Console(width=10_000)  # piped: never cut a value
    console.print(table)
    for line in legend_lines(summaries, with_notes=False):
        click.echo(line)


def register(group: click.Group) -> None:
    group.add_command(results_cmd)
