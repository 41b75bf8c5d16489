"""`orch results`: test metrics per effective config (config + `--set` overrides) × task, mean ±
std over seeds, every submitted seed accounted for."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.cli.common import check_suite_known, db_option, echo_json, open_store
from orchestrator.errors import UsageError
from orchestrator.results.aggregate import ResultSummary
from orchestrator.results.collect import NO_METRICS, PRINTED_SPLITS_NOTE
from orchestrator.results.filters import parse_where
from orchestrator.results.formats import (
    FORMATS,
    TABLE_COLUMNS,
    column_title,
    legend_lines,
    render_rows,
    score_line,
    table_lines,
    to_csv,
    to_records,
)
from orchestrator.results.grids import to_latex, to_markdown
from orchestrator.results.selection import (
    MIN_N_CHOSEN,
    Basis,
    Column,
    ColumnChoice,
    bold_legend,
    choice_notes,
    chosen_by,
    is_chosen,
    unchosen_columns,
)
from orchestrator.results.stats import paired_test, paired_text, row_interval
from orchestrator.results.table import build_table, no_metric_jobs
from orchestrator.store.early_stop import unreported_metrics
from orchestrator.wording import one_line


@click.command("results")
@click.option("--suite", default=None, help="Only this suite.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default=None,
    help="table (default), csv, markdown or latex (configs × tasks with n, chosen row in bold), json.",
)
@click.option(
    "--digits",
    type=click.IntRange(0, 10),
    default=4,
    show_default=True,
    help="Decimals shown in table, markdown and latex output.",
)
@click.option(
    "--metric",
    default=None,
    metavar="NAME",
    help="Show this metric in every row instead of each task's own (accuracy, F1 for MRPC/QQP, ...).",
)
@click.option(
    "--where",
    "where_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="Only settings with this value: suite, config, task or a config key (repeatable).",
)
@click.option(
    "--select",
    type=click.Choice([Basis.VAL.value]),
    default=None,
    help="val: per task, only the setting with the best mean on the validation split (n ≥ 2), "
    "with its test mean; bold follows it.",
)
@click.option(
    "--pooled",
    is_flag=True,
    help="Count every succeeded run, a rerun of a seed again (n = runs); the output says so. "
    "Default: the latest succeeded run of each seed (n = seeds).",
)
@click.option(
    "--partial",
    is_flag=True,
    help="Print markdown or latex although runs are still queued or running; the table says it is partial.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON: every row with its overrides and each run's job, attempt and ladder level.",
)
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV (same as --format csv).")
@click.option(
    "--ci",
    is_flag=True,
    help="Add each row's t-based 95 % interval of the mean to the table or --json (needs scipy).",
)
@click.option(
    "--compare",
    nargs=2,
    default=None,
    metavar="A B",
    help="Paired-by-seed t test of setting A against B per task (labels as the table shows them; "
    "needs scipy).",
)
@db_option
def results_cmd(
    suite: str | None,
    fmt: str | None,
    digits: int,
    metric: str | None,
    where_items: tuple[str, ...],
    select: str | None,
    pooled: bool,
    partial: bool,
    as_json: bool,
    as_csv: bool,
    ci: bool,
    compare: tuple[str, str] | None,
    db_path: Path,
) -> None:
    """Aggregate test metrics over seeds: one row per effective config (config and its --set
    overrides) × task, one value per seed (its latest succeeded run), every submitted seed
    accounted for (n of submitted; failed, cancelled and unfinished seeds named)."""
    chosen = {f for f, flag in (("json", as_json), ("csv", as_csv)) if flag} | ({fmt} if fmt else set())
    if len(chosen) > 1:
        raise click.UsageError("give one output format (--format, --json or --csv)")
    fmt = chosen.pop() if chosen else "table"
    if metric is not None and not metric.strip():
        raise UsageError("--metric '': give a metric name, e.g. --metric accuracy")
    if ci and fmt not in ("table", "json"):
        raise UsageError(f"--ci adds a column to the table or --json, not to {fmt}")
    filters = parse_where(where_items)
    basis = Basis(select) if select else None
    empty = "no results yet (no job submitted, or none kept by --where)"
    with open_store(db_path) as store:
        if suite is not None:
            check_suite_known(store, suite, db_path)
        table = build_table(store, suite, metric=metric, pooled=pooled, where=filters, digits=digits, select=basis)
        warned = unreported_metrics(store, suite)
    summaries, choices, missing = table.summaries, table.choices, table.missing
    if compare is not None:
        _print_comparison(summaries, compare, pooled, digits)
        return
    if fmt in ("markdown", "latex") and not partial:
        _refuse_unfinished(summaries)
    if basis is not None and fmt not in ("markdown", "latex"):
        for task, column_metric in unchosen_columns(choices):
            why = choices[(task, column_metric)].note  # the best rows' runs diverged (♯)
            _say(f"{column_title(task, column_metric)}: "
                 + (why or f"no setting with n ≥ 2 reported val {column_metric}: none selected"), err=True)
        if summaries and not any(is_chosen(s, choices) for s in summaries):
            # there are results, but none to choose by: say so, not "no results yet"
            diverged = " and no diverged run (♯)" if any(c.passed_over for c in choices.values()) else ""
            empty = (f"no setting reports a validation metric (on n ≥ {MIN_N_CHOSEN} seeds{diverged}) to choose "
                     f"on: `--select {select}` keeps none; without it every setting is shown")
        summaries = [s for s in summaries if is_chosen(s, choices)]
        missing = no_metric_jobs(table.rows, summaries)  # of the rows shown only
    if table.printed_splits and fmt == "table" and summaries:
        click.echo(PRINTED_SPLITS_NOTE)
    if fmt == "json":
        records = to_records(summaries, chosen_by(choices))
        if ci:
            for record, s in zip(records, summaries, strict=True):
                record["ci95"] = list(found) if (found := row_interval(s)) is not None else None
        echo_json(records)
    elif fmt == "csv":
        click.echo(to_csv(summaries, chosen_by(choices)), nl=False)
    elif fmt == "markdown":
        click.echo(to_markdown(summaries, digits, basis), nl=False)
    elif fmt == "latex":
        click.echo(to_latex(summaries, digits, basis), nl=False)
    else:
        _print_table(summaries, digits, choices, empty, ci)
    if missing and fmt != "json":
        click.echo(f"{missing} succeeded job(s) had {NO_METRICS}", err=True)
    for warning in warned if fmt != "json" else []:  # an early stopping that stopped nothing, say
        _say(f"early stopping: {warning}", err=True)


def _refuse_unfinished(summaries: list[ResultSummary]) -> None:
    """A table for a paper is printed only when every run has ended, or when asked for as partial."""
    going = [s for s in summaries if s.unfinished]
    if going:
        first = going[0]
        raise UsageError(
            f"{len(going)} row(s) have runs still queued or running (first: {first.label} · "
            f"{first.task}: {first.accounted}); wait for them, or pass --partial for a table marked partial"
        )


def _print_comparison(summaries: list[ResultSummary], compare: tuple[str, str], pooled: bool, digits: int) -> None:
    """`--compare A B`: per task both settings have, the paired-by-seed test of A against B."""
    if pooled:
        raise UsageError("--compare pairs one value per seed: leave out --pooled")
    several_suites = len({s.suite for s in summaries}) > 1
    by_label: dict[str, list[ResultSummary]] = {}
    for s in summaries:
        by_label.setdefault(f"{s.suite}/{s.label}" if several_suites else s.label, []).append(s)
    for name in compare:
        if name not in by_label:
            known = ", ".join(list(by_label)[:8]) + (", ..." if len(by_label) > 8 else "")
            raise UsageError(f"--compare: no setting {name!r} (settings: {known or 'none yet'})")
    rows_b = {(s.task, s.metric): s for s in by_label[compare[1]]}
    pairs = [(a, rows_b[(a.task, a.metric)]) for a in by_label[compare[0]] if (a.task, a.metric) in rows_b]
    if not pairs:
        raise UsageError(f"--compare: {compare[0]!r} and {compare[1]!r} share no task and metric")
    _say(f"A = {compare[0]}; B = {compare[1]}")
    for a, b in pairs:
        _say(paired_text(paired_test(a, b), digits))


def _print_table(summaries: list[ResultSummary], digits: int, choices: dict[Column, ColumnChoice], empty: str,
                 ci: bool = False) -> None:
    if not summaries:
        click.echo(empty)
        return
    rendered = [[one_line(cell) for cell in row] for row in render_rows(summaries, digits)]
    names = list(TABLE_COLUMNS)
    if ci:  # the interval after the mean
        at = names.index("mean ± std") + 1
        names.insert(at, "95% CI")
        for row, s in zip(rendered, summaries, strict=True):
            found = row_interval(s)
            row.insert(at, "—" if found is None else f"[{found[0]:.{digits}f}, {found[1]:.{digits}f}]")
    # Columns that say nothing in this table (no overrides, no val, no levels known, no notes) are left out.
    shown = [i for i, name in enumerate(names) if name not in ("overrides", "val", "levels", "notes")
             or any(row[i] not in ("", "-") for row in rendered)]
    table = Table(box=None, header_style="bold")
    for i in shown:
        table.add_column(names[i], overflow="fold")
    for row in rendered:
        table.add_row(*(Text(row[i]) for i in shown))  # Text: a `[…]` in a config name is not markup
    console = Console()
    if not console.is_terminal:
        console = Console(width=10_000)  # piped: never cut a value
    console.print(table)
    for line in footer_lines(summaries, choices, "val" in {names[i] for i in shown}, ci):
        click.echo(line)


def footer_lines(summaries: list[ResultSummary], choices: dict[Column, ColumnChoice], with_val: bool,
                 ci: bool = False) -> list[str]:
    """The lines under the terminal table: about the whole table, what its numbers are, its marks,
    what was chosen and the choice notes; each as one_line shows it (they name configs, tasks and
    metrics)."""
    interval = "; 95% CI: t-based interval of the mean (n − 1 degrees of freedom)" if ci else ""
    lines = [*table_lines(summaries), score_line(with_val, any(s.pooled for s in summaries)) + interval,
             *legend_lines(summaries, with_notes=False, hints=True)]
    bold = bold_legend(choices, {s.metric for s in summaries}).replace("bold:", "chosen:", 1)
    picked = [s for s in summaries if is_chosen(s, choices)]
    if bold and picked:
        lines.append(bold + ": " + "; ".join(f"{column_title(s.task, s.metric)} {s.label}".strip() for s in picked))
    lines += choice_notes(choices)
    return [one_line(line) for line in lines]


def _say(line: str, err: bool = False) -> None:
    """A line under the table or on stderr: it names configs, tasks and metrics (user text)."""
    click.echo(one_line(line), err=err)


def register(group: click.Group) -> None:
    group.add_command(results_cmd)
