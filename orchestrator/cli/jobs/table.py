"""The `orch jobs` table: whole values when piped; on a terminal id, state, config and the
note (wait reason or failure reason) stay readable and the other columns give way."""

from __future__ import annotations

from collections.abc import Sequence

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.api.jobs import shown_metric
from orchestrator.cli.plain_table import render_plain
from orchestrator.cli.tables import fit_columns, plain_columns, print_whole
from orchestrator.lifecycle import JobState
from orchestrator.store.job_facts import JobFacts
from orchestrator.store.queries import JobListRow
from orchestrator.wording import fmt_duration

COLUMNS = ("id", "state", "suite", "config", "seed", "data", "gpu", "att", "lvl", "metric", "time", "note")
STATE_STYLES = {
    "queued": "yellow",
    "running": "cyan",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
    "pruned": "blue",
}


STATE_TEXT = {s: s.value for s in JobState}  # a look-up: `.value` costs more, 100,000 rows at a time


def job_cells(r: JobListRow, extra: tuple[str, str] = ("-", "-")) -> list[str]:
    """`extra`: its headline metric and run time, as `jobs_extras` words them."""
    note = r.wait_reason if r.state is JobState.QUEUED else (r.reason or "")
    return [
        str(r.id), STATE_TEXT[r.state], r.suite, r.config_name, str(r.seed), r.data,
        "-" if r.gpu is None else str(r.gpu), str(r.attempt_count), str(r.level), *extra, note or "",
    ]


Extras = dict[int, tuple[str, str]]  # job id -> (headline metric, run time)


def jobs_extras(facts: dict[int, JobFacts]) -> Extras:
    return {job: (shown_metric(f.last_values), fmt_duration(f.run_s)) for job, f in facts.items()}


# Columns a narrow terminal drops first (last in this list first); id, state, config and note stay.
OPTIONAL = ("data", "seed", "lvl", "att", "gpu", "suite", "time", "metric")
FOLDED_MIN = {"config": 16, "note": 20}  # below these a long value is hard to read even folded


def visible_columns(cells: Sequence[Sequence[str]], width: int) -> list[str]:
    return fit_columns(COLUMNS, cells, width, FOLDED_MIN, OPTIONAL)


def jobs_table(rows: Sequence[JobListRow], columns: Sequence[str] = COLUMNS, extras: Extras | None = None) -> Table:
    """A rich table for a terminal: long configs and notes fold onto more lines, never `…`."""
    table = Table(box=None, header_style="bold")
    for column in columns:
        if column in ("config", "note"):
            table.add_column(column, overflow="fold", ratio=2 if column == "config" else 3)
        else:
            table.add_column(column, no_wrap=True)
    for r in rows:
        cells = dict(zip(COLUMNS, job_cells(r, (extras or {}).get(r.id, ("-", "-"))), strict=True))
        shown = [Text(cells[c]) for c in columns]  # Text: a `[…]` in a user's name is not markup
        if "state" in columns:
            shown[list(columns).index("state")] = Text(r.state.value, style=STATE_STYLES.get(r.state.value, ""))
        table.add_row(*shown)
    return table


RICH_TABLE_ROWS = 300  # above this many rows rich's layout takes seconds (~3 ms a row): plain columns


def print_jobs(rows: Sequence[JobListRow], *, wide: bool = False, console: Console | None = None,
               extras: Extras | None = None) -> None:
    console = console or Console()
    extras = extras or {}
    cells = [job_cells(r, extras.get(r.id, ("-", "-"))) for r in rows]
    if not console.is_terminal:
        click.echo(plain_columns(COLUMNS, cells), nl=False)
    elif len(rows) > RICH_TABLE_ROWS:  # whole values, states coloured, in a fraction of the time
        click.echo(render_plain(COLUMNS, cells, [STATE_STYLES.get(STATE_TEXT[r.state]) for r in rows], coloured_column=1))
    elif wide:
        print_whole(jobs_table(rows, extras=extras), console)
    else:
        columns = visible_columns(cells, console.width)
        console.print(jobs_table(rows, columns, extras))
        hidden = [c for c in COLUMNS if c not in columns]
        if hidden:
            console.print(f"({', '.join(hidden)} hidden on this narrow terminal: --wide shows every column)",
                          style="dim", markup=False, highlight=False)
