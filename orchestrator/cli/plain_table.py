"""A plain aligned table for long listings: rich measures and renders every cell through its
layout engine (about 3 ms a row), so `orch jobs` over thousands of jobs prints this instead:
the same columns, padded to the widest cell, the state coloured, no wrapping."""

from __future__ import annotations

from collections.abc import Sequence

import click

from orchestrator.wording import one_line


def render_plain(
    columns: Sequence[str], rows: Sequence[Sequence[str]], colours: Sequence[str | None] | None = None,
    coloured_column: int | None = None,
) -> str:
    """Lines of a table; cell `coloured_column` of row i gets colour `colours[i]` (click's
    names; ANSI codes that click strips when the output is not a terminal)."""
    rows = [[one_line(cell) for cell in row] for row in rows]  # names are written by user code
    widths = [len(c) for c in columns]
    for row in rows:
        for i, cell in enumerate(row):
            if len(cell) > widths[i]:
                widths[i] = len(cell)
    last = len(columns) - 1
    out = ["  ".join(click.style(c.ljust(widths[i]) if i < last else c, bold=True) for i, c in enumerate(columns))]
    for r, row in enumerate(rows):
        cells = []
        for i, cell in enumerate(row):
            text = cell.ljust(widths[i]) if i < last else cell
            if i == coloured_column and colours is not None and colours[r]:
                text = click.style(text, fg=colours[r])
            cells.append(text)
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)
