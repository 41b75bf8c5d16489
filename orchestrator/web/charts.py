"""SVG drawn on the server: the timeline, memory over time, loss curves, result dot plots.

Pure functions from typed rows to SVG text; every string from the database or a run dir is
escaped. Hover text is SVG <title>, which every browser shows without JavaScript.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape

from orchestrator.runfiles import LossPoint
from orchestrator.store.gpu_samples import GpuSample
from orchestrator.store.web_queries import AttemptSpan

OUTCOME_COLOURS = {
    "running": "#3b7dd8",
    "succeeded": "#2e9d5b",
    "oom": "#d64545",
    "host_oom": "#e07b00",
    "failed": "#7b2a8c",
    "lost": "#777777",
    "cancelled": "#b9b9b9",
}
OOM = ("oom", "host_oom")
MEMORY_COLOURS = {"ours": "#3b7dd8", "foreign": "#e0a030", "free": "#e6e6e6"}

WIDTH = 1000
LEFT = 64
RIGHT = 12
BAR_H = 14
BAR_GAP = 3
LANE_GAP = 10
AXIS_H = 22
MAX_MEMORY_POINTS = 600


def clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def stamp(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))


def mib(value: float) -> str:
    return f"{value / 1024:.1f} GiB"


def _ticks(t0: float, t1: float, x_of: object, height: float) -> str:
    span = max(t1 - t0, 1e-6)
    steps = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400)
    step = next((s for s in steps if span / s <= 8), 86400 * max(1, round(span / 86400 / 8)))
    first = (int(t0 // step) + 1) * step
    parts = []
    t = float(first)
    while t < t1:
        x = x_of(t)  # type: ignore[operator]
        parts.append(f'<line class="tick" x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{height:.0f}"/>'
                     f'<text class="tick-label" x="{x:.1f}" y="{height + 14:.0f}">{clock(t)}</text>')
        t += step
    return "".join(parts)


def pack_lanes(spans: Sequence[AttemptSpan], now_s: float) -> dict[int, int]:
    """Attempt id -> row within its GPU's lane, so bars that overlap in time do not overlap
    on screen (first row free at the bar's start)."""
    rows: dict[int, int] = {}
    ends_by_gpu: dict[int, list[float]] = {}
    for s in sorted(spans, key=lambda s: (s.started_at, s.attempt_id)):
        ends = ends_by_gpu.setdefault(s.gpu, [])
        end = s.ended_at if s.ended_at is not None else now_s
        row = next((i for i, e in enumerate(ends) if e <= s.started_at), len(ends))
        if row == len(ends):
            ends.append(end)
        else:
            ends[row] = end
        rows[s.attempt_id] = row
    return rows


def span_title(s: AttemptSpan) -> str:
    outcome = s.outcome or "running"
    step = f" ({s.level_step})" if s.level_step else ""
    ended = clock(s.ended_at) if s.ended_at is not None else "now"
    return (f"job {s.job_id} · {s.suite}/{s.config} · seed {s.seed} · {s.data}\n"
            f"attempt {s.n} · GPU {s.gpu} · level {s.level}{step} · {outcome}\n"
            f"peak {mib(s.peak_mib)} (predicted {mib(s.predicted_mib)}) · {clock(s.started_at)} → {ended}")


def timeline_svg(
    spans: Sequence[AttemptSpan], t0: float, t1: float, now_s: float, *, gpus: Sequence[int] = (), link: bool = True
) -> str:
    if t1 <= t0:
        t1 = t0 + 1.0
    plot_w = WIDTH - LEFT - RIGHT

    def x_of(t: float) -> float:
        return LEFT + (min(max(t, t0), t1) - t0) / (t1 - t0) * plot_w

    rows = pack_lanes(spans, now_s)
    lanes = sorted(set(gpus) | {s.gpu for s in spans})
    lane_rows = {g: 1 + max((rows[s.attempt_id] for s in spans if s.gpu == g), default=0) for g in lanes}
    lane_y: dict[int, float] = {}
    y = 4.0
    for g in lanes:
        lane_y[g] = y
        y += lane_rows[g] * (BAR_H + BAR_GAP) + LANE_GAP
    height = max(y, 30.0)
    parts = [
        f'<svg class="timeline" viewBox="0 0 {WIDTH} {height + AXIS_H:.0f}" width="100%" '
        f'data-t0="{t0:.3f}" data-t1="{t1:.3f}" data-left="{LEFT}" data-plot-width="{plot_w}" data-width="{WIDTH}" '
        f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="attempts per GPU over time">',
        _ticks(t0, t1, x_of, height),
    ]
    for g in lanes:
        lane_h = lane_rows[g] * (BAR_H + BAR_GAP)
        parts.append(f'<rect class="lane" x="{LEFT}" y="{lane_y[g] - 2:.1f}" width="{plot_w}" height="{lane_h + 2:.1f}"/>'
                     f'<text class="lane-label" x="4" y="{lane_y[g] + BAR_H - 3:.1f}">GPU {g}</text>')
    for s in spans:
        end = s.ended_at if s.ended_at is not None else now_s
        if end < t0 or s.started_at > t1:
            continue
        x0, x1 = x_of(s.started_at), x_of(end)
        w = max(x1 - x0, 1.5)
        by = lane_y[s.gpu] + rows[s.attempt_id] * (BAR_H + BAR_GAP)
        outcome = s.outcome or "running"
        colour = OUTCOME_COLOURS.get(outcome, "#444")
        bar = [f'<g class="attempt" data-attempt="{s.attempt_id}" data-job="{s.job_id}" data-outcome="{escape(outcome)}" '
               f'data-level="{s.level}"><title>{escape(span_title(s))}</title>'
               f'<rect class="bar" x="{x0:.1f}" y="{by:.1f}" width="{w:.1f}" height="{BAR_H}" rx="2" fill="{colour}"/>']
        if w >= 22:
            bar.append(f'<text class="lvl" x="{x0 + 3:.1f}" y="{by + BAR_H - 3.5:.1f}">L{s.level}</text>')
        if outcome in OOM:
            bar.append(f'<path class="oom-mark" d="M{x0 + w - 5:.1f},{by - 2:.1f} h10 l-5,7 z"/>')
        bar.append("</g>")
        body = "".join(bar)
        parts.append(f'<a href="/job/{s.job_id}">{body}</a>' if link else body)
    parts.append("</svg>")
    return "".join(parts)


def timeline_legend() -> str:
    items = "".join(
        f'<span class="key"><i style="background:{c}"></i>{escape(k)}</span>' for k, c in OUTCOME_COLOURS.items()
    )
    return f'<div class="legend">{items}<span class="key"><b class="oom-key">▼</b>OOM struck here</span>' \
           '<span class="key">Ln: ladder level</span></div>'


def _thin(samples: list[GpuSample], limit: int) -> list[GpuSample]:
    if len(samples) <= limit:
        return samples
    stride = -(-len(samples) // limit)
    return samples[::stride] + ([samples[-1]] if (len(samples) - 1) % stride else [])


def memory_svg(samples: Sequence[GpuSample]) -> str:
    """One panel per GPU: ours, foreign and free memory stacked over time."""
    if not samples:
        return '<p class="empty">no memory samples yet (the daemon records them while it runs)</p>'
    by_gpu: dict[int, list[GpuSample]] = {}
    for s in samples:
        by_gpu.setdefault(s.gpu_index, []).append(s)
    t0 = min(s.ts for s in samples)
    t1 = max(s.ts for s in samples)
    t1 = t1 if t1 > t0 else t0 + 1.0
    panel_h, gap = 80.0, 26.0
    plot_w = WIDTH - LEFT - RIGHT
    height = len(by_gpu) * (panel_h + gap)
    parts = [f'<svg class="memory" viewBox="0 0 {WIDTH} {height + AXIS_H:.0f}" width="100%" '
             f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="GPU memory over time">']

    def x_of(t: float) -> float:
        return LEFT + (t - t0) / (t1 - t0) * plot_w

    parts.append(_ticks(t0, t1, x_of, height))
    for i, (gpu, series) in enumerate(sorted(by_gpu.items())):
        series = _thin(series, MAX_MEMORY_POINTS)
        top = i * (panel_h + gap) + 4
        total = max(max(s.total_mib for s in series), 1)

        def y_of(value: float, top: float = top, total: int = total) -> float:
            return top + panel_h - min(value, total) / total * panel_h

        def band(lower: list[float], upper: list[float], series: list[GpuSample] = series) -> str:
            fwd = " ".join(f"{x_of(s.ts):.1f},{y_of(u):.1f}" for s, u in zip(series, upper, strict=True))
            back = " ".join(f"{x_of(s.ts):.1f},{y_of(lo):.1f}" for s, lo in reversed(list(zip(series, lower, strict=True))))
            return f"{fwd} {back}"

        ours = [float(s.orch_mib) for s in series]
        used = [float(max(s.used_mib, s.orch_mib)) for s in series]
        full = [float(s.total_mib) for s in series]
        zero = [0.0] * len(series)
        last = series[-1]
        parts.append(
            f'<g class="gpu-memory" data-gpu="{gpu}"><title>GPU {gpu} at {clock(last.ts)}: ours {mib(last.orch_mib)}, '
            f'foreign {mib(last.foreign_mib)}, free {mib(last.free_mib)} of {mib(last.total_mib)}</title>'
            f'<text class="lane-label" x="4" y="{top + 14:.1f}">GPU {gpu}</text>'
            f'<text class="axis-label" x="4" y="{top + 28:.1f}">{mib(total)}</text>'
            f'<polygon fill="{MEMORY_COLOURS["free"]}" points="{band(used, full)}"/>'
            f'<polygon fill="{MEMORY_COLOURS["foreign"]}" points="{band(ours, used)}"/>'
            f'<polygon fill="{MEMORY_COLOURS["ours"]}" points="{band(zero, ours)}"/></g>'
        )
    parts.append("</svg>")
    return "".join(parts)


def memory_legend() -> str:
    return '<div class="legend">' + "".join(
        f'<span class="key"><i style="background:{c}"></i>{k}</span>' for k, c in MEMORY_COLOURS.items()
    ) + "</div>"


def loss_svg(curves: Sequence[tuple[str, Sequence[LossPoint]]]) -> str:
    """Loss over steps, one line per attempt."""
    points = [p for _, curve in curves for p in curve]
    if not points:
        return '<p class="empty">no loss reported in progress.jsonl</p>'
    s0, s1 = min(p.step for p in points), max(p.step for p in points)
    l0, l1 = min(p.loss for p in points), max(p.loss for p in points)
    s1, l1 = (s1 if s1 > s0 else s0 + 1), (l1 if l1 > l0 else l0 + 1e-9)
    w, h, left, bottom = 600.0, 200.0, 56.0, 20.0
    palette = ("#3b7dd8", "#d64545", "#2e9d5b", "#e07b00", "#7b2a8c", "#777777")
    parts = [f'<svg class="loss" viewBox="0 0 {w:.0f} {h + bottom:.0f}" width="100%" xmlns="http://www.w3.org/2000/svg">',
             f'<text class="axis-label" x="2" y="12">{l1:.4g}</text><text class="axis-label" x="2" y="{h:.0f}">{l0:.4g}</text>',
             f'<text class="axis-label" x="{left:.0f}" y="{h + 16:.0f}">step {s0:g}</text>'
             f'<text class="axis-label" x="{w - 70:.0f}" y="{h + 16:.0f}">step {s1:g}</text>']
    for i, (label, curve) in enumerate(curves):
        line = " ".join(
            f"{left + (p.step - s0) / (s1 - s0) * (w - left - 4):.1f},{4 + (l1 - p.loss) / (l1 - l0) * (h - 8):.1f}" for p in curve
        )
        parts.append(f'<polyline class="loss-line" fill="none" stroke="{palette[i % len(palette)]}" stroke-width="1.6" '
                     f'points="{line}"><title>{escape(label)}</title></polyline>')
    parts.append("</svg>")
    return "".join(parts)


def dots_svg(values: Sequence[tuple[int, float]], mean: float | None, std: float, lo: float, hi: float) -> str:
    """One result row: seeds as points, mean ± std as a line with a tick, on a shared axis."""
    w, h = 180.0, 16.0
    span = hi - lo if hi > lo else 1.0

    def x_of(v: float) -> float:
        return 4 + (v - lo) / span * (w - 8)

    parts = [f'<svg class="dots" viewBox="0 0 {w:.0f} {h:.0f}" width="{w:.0f}" height="{h:.0f}" xmlns="http://www.w3.org/2000/svg">']
    if mean is not None:
        parts.append(f'<line class="sd" x1="{x_of(mean - std):.1f}" x2="{x_of(mean + std):.1f}" y1="8" y2="8"/>'
                     f'<line class="mean" x1="{x_of(mean):.1f}" x2="{x_of(mean):.1f}" y1="2" y2="14"/>')
    for seed, value in values:
        parts.append(f'<circle class="seed" cx="{x_of(value):.1f}" cy="8" r="3"><title>seed {seed}: {value:.4f}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)
