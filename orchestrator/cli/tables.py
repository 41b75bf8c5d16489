"""Printing tables so that no value is ever cut where it matters.

Piped or redirected output gets full values in plain columns (so `orch jobs | grep alpha16`
finds alpha16); a terminal gets rich tables that fold long values instead of eliding them."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, RenderableType


def plain_columns(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, every value whole; no trailing spaces."""
    table = [list(headers), *[[str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[i]) for row in table if i < len(row)) for i in range(len(headers))]
    lines = []
    for row in table:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


_PAD = 2  # rich's cell padding between columns


def fit_columns(
    headers: Sequence[str],
    cells: Sequence[Sequence[str]],
    width: int,
    folded_min: dict[str, int],
    optional: Sequence[str],
) -> list[str]:
    """The columns that fit `width`. Columns in `folded_min` fold and are always shown (with at
    least that width); `optional` ones are added in order while they fit whole; any other
    column is always shown whole."""
    natural = {h: max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)}
    shown = {h for h in headers if h not in optional}
    used = sum((min(natural[h], folded_min[h]) if h in folded_min else natural[h]) + _PAD for h in shown)
    for column in optional:
        if used + natural[column] + _PAD > width:
            break
        used += natural[column] + _PAD
        shown.add(column)
    return [h for h in headers if h in shown]


def print_whole(renderable: RenderableType, console: Console | None = None) -> None:
    """Print at the width the renderable needs (at least the console's): nothing is elided."""
    console = console or Console()
    probe = Console(width=100_000, color_system=None, file=console.file)
    needed = probe.measure(renderable).maximum
    Console(width=max(needed, console.width if console.is_terminal else 0, 40), file=console.file,
            force_terminal=console.is_terminal).print(renderable)
