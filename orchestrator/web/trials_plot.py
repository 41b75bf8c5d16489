"""The search page's plots: each trial's final metric against each searched key, one small
SVG scatter per key (a log axis for a key drawn log-uniformly, evenly spaced values for a list).
Pure: trial rows in, markup out; every text from user code is shown as wording.one_line shows it,
then escaped."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup
from markupsafe import escape as escape_markup

from orchestrator.results.trials import TrialRow
from orchestrator.wording import one_line

WIDTH, HEIGHT, PAD = 320, 180, 34


@dataclass(frozen=True)
class KeyPlot:
    key: str
    svg: Markup


def _escaped(text: str) -> Markup:
    """Text from user code in the SVG: shown as every page shows it (wording.one_line), then
    escaped."""
    return escape_markup(one_line(text))


def _x_positions(values: Sequence[object], log: bool) -> tuple[list[float], list[str]]:
    """Each value's place on [0, 1], and the axis's two end labels."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        numbers = [float(v) for v in values]  # type: ignore[arg-type]
        if log and all(v > 0 for v in numbers):
            numbers = [math.log10(v) for v in numbers]
        low, high = min(numbers), max(numbers)
        span = (high - low) or 1.0
        shown = [
            f"{10**low:.3g}" if log else f"{low:.3g}",
            f"{10**high:.3g}" if log else f"{high:.3g}",
        ]
        return [(v - low) / span for v in numbers], shown
    distinct = sorted({str(v) for v in values})
    place = {v: (i + 0.5) / len(distinct) for i, v in enumerate(distinct)}
    return [place[str(v)] for v in values], [distinct[0], distinct[-1]]


def key_plots(
    rows: Sequence[TrialRow], keys: Sequence[str], log_keys: set[str], metric: str
) -> list[KeyPlot]:
    """One scatter per key of the trials that have a value; the best trial drawn filled."""
    valued = [r for r in rows if r.value is not None]
    if not valued:
        return []
    values = [float(r.value) for r in valued if r.value is not None]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    best = valued[0].trial  # rows come best first
    plots = []
    for key in keys:
        xs, ends = _x_positions([r.params.get(key) for r in valued], key in log_keys)
        dots = []
        for row, x in zip(valued, xs, strict=True):
            cx = PAD + x * (WIDTH - 2 * PAD)
            cy = HEIGHT - PAD - ((float(row.value or 0.0) - low) / span) * (HEIGHT - 2 * PAD)
            title = _escaped(
                f"trial {row.trial}: {key}={row.params.get(key)}, {metric} {row.value:.4f}"
            )
            fill = "#3b7dd8" if row.trial == best else "none"
            dots.append(
                f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4" fill="{fill}" stroke="#3b7dd8">'
                f"<title>{title}</title></circle>"
            )
        axes = (
            f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#999"/>'
            f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#999"/>'
            f'<text x="{PAD}" y="{HEIGHT - 8}" font-size="10">{_escaped(ends[0])}</text>'
            f'<text x="{WIDTH - PAD}" y="{HEIGHT - 8}" font-size="10" text-anchor="end">{_escaped(ends[1])}</text>'
            f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" font-size="11" text-anchor="middle">{_escaped(key)}'
            f"{' (log)' if key in log_keys else ''}</text>"
            f'<text x="4" y="{PAD - 6}" font-size="10">{_escaped(metric)} {high:.4f}</text>'
            f'<text x="4" y="{HEIGHT - PAD + 12}" font-size="10">{low:.4f}</text>'
        )
        svg = (
            f'<svg class="trials-plot" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'role="img" aria-label="{_escaped(metric)} against {_escaped(key)}">{axes}{"".join(dots)}</svg>'
        )
        plots.append(KeyPlot(key, Markup(svg)))
    return plots
