"""The `orch jobs` table: whole values when piped; on a terminal id, state, config and the
note (wait reason or failure reason) stay readable and the other columns give way."""

from __future__ import annotations

from collections.abc import Sequence

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.cli.plain_table import render_plain
from orchestrator.cli.tables import fit_columns, plain_columns, print_whole
from orchestrator.lifecycle import JobState
from orchestrator.store.queries import JobListRow

COLUMNS = ("id", "state", "suite", "config", "seed", "data", "gpu", "att", "lvl", "note")
STATE_STYLES = {
    "queued": "yellow",
    "running": "cyan",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
}


STATE_TEXT = {s: s.value for s in JobState}  # a look-up: `.value` costs more, 100,000 rows at a time


def job_cells(r: JobListRow) -> list[str]:
    note = r.wait_reason if r.state is JobState.QUEUED else (r.reason or "")
    return [
        str(r.id), STATE_TEXT[r.state], r.suite, r.config_name, str(r.seed), r.data,
        "-" if r.gpu is None else str(r.gpu), str(r.attempt_count), str(r.level), note or "",
    ]


# Columns a narrow terminal drops first (last in this list first); id, state, config and note stay.
OPTIONAL = ("data", "seed", "lvl", "att", "gpu", "suite")
FOLDED_MIN = {"config": 16, "note": 20}  # below these a long value is hard to read even folded


def visible_columns(cells: Sequence[Sequence[str]], width: int) -> list[str]:
    return fit_columns(COLUMNS, cells, width, FOLDED_MIN, OPTIONAL)


def jobs_table(rows: Sequence[JobListRow], columns: Sequence[str] = COLUMNS) -> Table:
    """A rich table for a terminal: long configs and notes fold onto more lines, never `…`."""
    table = Table(box=None, header_style="bold")
    for column in columns:
        if column in ("config", "note"):
            table.add_column(column, overflow="fold", ratio=2 if column == "config" else 3)
        else:
            table.add_column(column, no_wrap=True)
    for r in rows:
        cells = dict(zip(COLUMNS, job_cells(r), strict=True))
        shown: list[str | Text] = [cells[c] for c in columns]
        if "state" in columns:
            shown[list(columns).index("state")] = Text(r.state.value, style=STATE_STYLES.get(r.state.value, ""))
        table.add_row(*shown)
    return table


RICH_TABLE_ROWS = 300  # above this many rows rich's layout takes seconds (~3 ms a row): plain columns


def print_jobs(rows: Sequence[JobListRow], *, wide: bool = False, console: Console | None = None) -> None:
    console = console or Console()
    if not console.is_terminal:
        click.echo(plain_columns(COLUMNS, [job_cells(r) for r in rows]), nl=False)
    elif len(rows) > RICH_TABLE_ROWS:  # whole values, states coloured, in a fraction of the time
        click.echo(render_plain(COLUMNS, [job_cells(r) for r in rows], [STATE_STYLES.get(STATE_TEXT[r.state]) for r in rows],
                                coloured_column=1))
    elif wide:
        print_whole(jobs_table(rows), console)
    else:
        columns = visible_columns([job_cells(r) for r in rows], console.width)
        console.print(jobs_table(rows, columns))
        hidden = [c for c in COLUMNS if c not in columns]
        if hidden:
            console.print(f"({', '.join(hidden)} hidden on this narrow terminal: --wide shows every column)",
                          style="dim", markup=False, highlight=False)
