"""The `orch jobs` table: whole values when piped; on a terminal id, state, config, setting,
seed and the note (wait reason or failure reason) stay readable and the other columns give way.
The setting is each job's overrides (`--set`, `--grid`): the jobs of a grid differ only there."""

from __future__ import annotations

from collections.abc import Sequence

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.api.jobs import earlier_attempt, shown_metric
from orchestrator.cli.plain_table import render_plain
from orchestrator.cli.tables import fit_columns, plain_columns, print_whole
from orchestrator.lifecycle import JobState
from orchestrator.store.job_facts import JobFacts
from orchestrator.store.queries import JobListRow
from orchestrator.wording import fmt_duration, fmt_setting, one_line, setting_pairs, short_keys

COLUMNS = ("id", "state", "suite", "config", "setting", "seed", "data", "gpu", "att", "lvl", "metric",
           "time", "note")
STATE_STYLES = {
    "queued": "yellow",
    "running": "cyan",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
    "pruned": "blue",
}


STATE_TEXT = {s: s.value for s in JobState}  # a look-up: `.value` costs more, 100,000 rows at a time


def job_cells(r: JobListRow, extra: tuple[str, str] = ("-", "-"),
              names: dict[str, str] | None = None) -> list[str]:
    """`extra`: its headline metric and run time, as `jobs_extras` words them; `names`: the
    short keys of the setting on a terminal (none when piped: `learning_rate=0.001,batch_size=8`,
    one word, so a pipe can split the line on spaces)."""
    note = r.wait_reason if r.state is JobState.QUEUED else (r.reason or "")
    setting = fmt_setting(r.overrides, names, " " if names is not None else ",")
    return [
        str(r.id), STATE_TEXT[r.state], r.suite, r.config_name, setting, str(r.seed), r.data,
        "-" if r.gpu is None else str(r.gpu), str(r.attempt_count), str(r.level), *extra, note or "",
    ]


Extras = dict[int, tuple[str, str]]  # job id -> (headline metric, run time)


def jobs_extras(facts: dict[int, JobFacts], tasks: dict[int, str] | None = None,
                attempts: dict[int, int] | None = None) -> Extras:
    """`tasks`: each job's task, whose primary metric is its headline (as in `orch results`);
    `attempts`: each job's latest attempt, so that a value an earlier attempt reported (a retry
    that has reported nothing yet) says whose it is."""
    extras: Extras = {}
    for job, f in facts.items():
        metric = shown_metric(f.last_values, (tasks or {}).get(job, ""))
        earlier = earlier_attempt(f.attempt, (attempts or {}).get(job))
        if metric != "-" and earlier is not None:
            metric += f"@att{earlier}"  # one word still, for piped columns
        extras[job] = (metric, fmt_duration(f.run_s))
    return extras


# Columns a narrow terminal drops first (last in this list first); id, state, config, the
# setting, the seed and the note stay: the jobs of one config differ by seed and setting only.
OPTIONAL = ("data", "lvl", "att", "gpu", "suite", "time", "metric")
# below these a long value is hard to read even folded
FOLDED_MIN = {"config": 16, "setting": 12, "note": 20}


def visible_columns(cells: Sequence[Sequence[str]], width: int) -> list[str]:
    """The columns that fit `width`; the setting only when a job listed has one."""
    at = COLUMNS.index("setting")
    if any(row[at] != "-" for row in cells):
        return fit_columns(COLUMNS, cells, width, FOLDED_MIN, OPTIONAL)
    without = [[value for i, value in enumerate(row) if i != at] for row in cells]
    return fit_columns([c for c in COLUMNS if c != "setting"], without, width, FOLDED_MIN, OPTIONAL)


def setting_names(rows: Sequence[JobListRow]) -> dict[str, str]:
    """The short name of every setting key of these rows (`lr` for `learning_rate`)."""
    return short_keys(k for r in rows for k, _ in setting_pairs(r.overrides))


def legend(names: dict[str, str]) -> str:
    """`setting: lr = learning_rate, bs = batch_size`; empty when no key was shortened."""
    shortened = sorted((short, key) for key, short in names.items() if short != key)
    if not shortened:
        return ""
    return "setting: " + ", ".join(f"{short} = {key}" for short, key in shortened)


def jobs_table(rows: Sequence[JobListRow], columns: Sequence[str] = COLUMNS,
               extras: Extras | None = None, names: dict[str, str] | None = None) -> Table:
    """A rich table for a terminal: long configs, settings and notes fold onto more lines,
    never `…`."""
    table = Table(box=None, header_style="bold")
    for column in columns:
        if column in FOLDED_MIN:
            table.add_column(column, overflow="fold", ratio=3 if column == "note" else 2)
        else:
            table.add_column(column, no_wrap=True)
    names = setting_names(rows) if names is None else names
    for r in rows:
        extra = (extras or {}).get(r.id, ("-", "-"))
        cells = dict(zip(COLUMNS, job_cells(r, extra, names), strict=True))
        shown = [Text(one_line(cells[c])) for c in columns]  # Text: a `[…]` in a user's name is not markup
        if "state" in columns:
            shown[list(columns).index("state")] = Text(r.state.value, style=STATE_STYLES.get(r.state.value, ""))
        table.add_row(*shown)
    return table


RICH_TABLE_ROWS = 300  # above this many rows rich's layout takes seconds (~3 ms a row): plain columns


def print_jobs(rows: Sequence[JobListRow], *, wide: bool = False, console: Console | None = None,
               extras: Extras | None = None) -> None:
    console = console or Console()
    extras = extras or {}
    if not console.is_terminal:
        piped = [job_cells(r, extras.get(r.id, ("-", "-"))) for r in rows]
        click.echo(plain_columns(COLUMNS, piped), nl=False)
        return
    names = setting_names(rows)
    cells = [job_cells(r, extras.get(r.id, ("-", "-")), names) for r in rows]
    if len(rows) > RICH_TABLE_ROWS:  # whole values, states coloured, in a fraction of the time
        click.echo(
            render_plain(
                COLUMNS,
                cells,
                [STATE_STYLES.get(STATE_TEXT[r.state]) for r in rows],
                coloured_column=1,
            )
        )
    elif wide:
        print_whole(jobs_table(rows, extras=extras, names=names), console)
    else:
        columns = visible_columns(cells, console.width)
        console.print(jobs_table(rows, columns, extras, names))
        hidden = [c for c in COLUMNS if c not in columns and c != "setting"]
        if hidden:
            console.print(f"({', '.join(hidden)} hidden on this narrow terminal: --wide shows every column)",
                          style="dim", markup=False, highlight=False)
    if legend(names):
        console.print(legend(names), style="dim", markup=False, highlight=False)
