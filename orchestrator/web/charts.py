"""Geometry of the drawings no chart library makes for us: the timeline's packing picture
(one lane per GPU, one bar per attempt, stacked where attempts shared the card) and the
results' seed dot plots. Pure: typed rows in, positions and labels out; the SVG itself is a
template (templates/timeline_svg.html), which escapes every string."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.store.web_queries import AttemptSpan
from orchestrator.web.templating import clock, mib

OUTCOME_COLOURS = {
    "running": "#3b7dd8",
    "succeeded": "#2e9d5b",
    "oom": "#d64545",
    "host_oom": "#e07b00",
    "group_oom": "#e8a0a0",  # a fused group's OOM: not the job's own, requeued uncounted
    "failed": "#7b2a8c",
    "lost": "#777777",
    "cancelled": "#b9b9b9",
    "pruned": "#8fb3d9",
}
OOM = ("oom", "host_oom")
MEMORY_COLOURS = {"ours": "#3b7dd8", "foreign": "#e0a030", "free": "#e6e6e6"}

# The drawing's own units: the page scales it to its width (at most 1,100 px, orch.css), so at
# 800 px its 12-unit labels read at about 10 px, and at 1,280 px at about 15.
WIDTH = 900
LEFT = 64
RIGHT = 12
BAR_H = 16
BAR_GAP = 3
LANE_GAP = 10
AXIS_H = 24
LABEL_CHAR_PX = 6.8  # width of one character of a bar label (12-unit system font), to decide what fits
TICK_LABEL_HALF_PX = 28  # half the width of an HH:MM:SS tick label


@dataclass(frozen=True)
class Tick:
    x: float
    label: str
    anchor: str  # "middle", or "end" where a centred label would run past the chart's right edge


@dataclass(frozen=True)
class Lane:
    gpu: int
    y: float
    height: float


@dataclass(frozen=True)
class Bar:
    span: AttemptSpan
    x: float
    y: float
    width: float
    colour: str
    outcome: str
    label: str  # what fits inside the bar: "L1 · job 12 · config", a shorter form, or ""
    title: str  # hover text
    oom: bool


@dataclass(frozen=True)
class TimelineLayout:
    width: int
    height: float  # of the lanes; the time axis is drawn below
    left: int
    plot_width: float
    t0: float
    t1: float
    ticks: list[Tick]
    lanes: list[Lane]
    bars: list[Bar]
    bar_h: int = BAR_H
    axis_h: int = AXIS_H


def time_ticks(t0: float, t1: float, left: float, plot_width: float) -> list[Tick]:
    """At most ~8 round times (1 s … 1 day apart) inside (t0, t1)."""
    span = max(t1 - t0, 1e-6)
    steps = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400)
    step = next((s for s in steps if span / s <= 8), 86400 * max(1, round(span / 86400 / 8)))
    ticks = []
    t = float((int(t0 // step) + 1) * step)
    while t < t1:
        x = left + (t - t0) / span * plot_width
        anchor = "end" if x + TICK_LABEL_HALF_PX > left + plot_width + RIGHT else "middle"
        ticks.append(Tick(x, clock(t), anchor))
        t += step
    return ticks


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


def bar_label(s: AttemptSpan, width_px: float) -> str:
    """The longest of "L1 · job 12 · config", "job 12 · config", "job 12", "L1" that fits."""
    for text in (
        f"L{s.level} · job {s.job_id} · {s.config}",
        f"job {s.job_id} · {s.config}",
        f"job {s.job_id}",
        f"L{s.level}",
    ):
        if len(text) * LABEL_CHAR_PX + 6 <= width_px:
            return text
    return ""


def timeline_layout(
    spans: Sequence[AttemptSpan], t0: float, t1: float, now_s: float, *, gpus: Sequence[int] = ()
) -> TimelineLayout:
    if t1 <= t0:
        t1 = t0 + 1.0
    plot_w = WIDTH - LEFT - RIGHT

    def x_of(t: float) -> float:
        return LEFT + (min(max(t, t0), t1) - t0) / (t1 - t0) * plot_w

    rows = pack_lanes(spans, now_s)
    gpu_ids = sorted(set(gpus) | {s.gpu for s in spans})
    lane_rows = {g: 1 + max((rows[s.attempt_id] for s in spans if s.gpu == g), default=0) for g in gpu_ids}
    lanes: list[Lane] = []
    lane_y: dict[int, float] = {}
    y = 4.0
    for g in gpu_ids:
        lane_y[g] = y
        lanes.append(Lane(g, y, lane_rows[g] * (BAR_H + BAR_GAP)))
        y += lane_rows[g] * (BAR_H + BAR_GAP) + LANE_GAP
    bars = []
    for s in spans:
        end = s.ended_at if s.ended_at is not None else now_s
        if end < t0 or s.started_at > t1:
            continue
        x0 = x_of(s.started_at)
        w = max(x_of(end) - x0, 1.5)
        outcome = s.outcome or "running"
        # rounded here (0.1 px), so the template writes them as they are
        bars.append(Bar(s, round(x0, 1), round(lane_y[s.gpu] + rows[s.attempt_id] * (BAR_H + BAR_GAP), 1), round(w, 1),
                        OUTCOME_COLOURS.get(outcome, "#444"), outcome, bar_label(s, w), span_title(s), outcome in OOM))
    return TimelineLayout(WIDTH, max(y, 30.0), LEFT, plot_w, t0, t1, time_ticks(t0, t1, LEFT, plot_w), lanes, bars)


@dataclass(frozen=True)
class Dot:
    x: float
    seed: int
    value: float


@dataclass(frozen=True)
class DotPlot:
    """One result row on a shared axis: seeds as points, mean ± std as a line with a tick."""

    width: float
    mean_x: float | None
    sd_x0: float
    sd_x1: float
    dots: list[Dot]


def dot_plot(values: Sequence[tuple[int, float]], mean: float | None, std: float, lo: float, hi: float) -> DotPlot:
    w = 180.0
    span = hi - lo if hi > lo else 1.0

    def x_of(v: float) -> float:
        return 4 + (v - lo) / span * (w - 8)

    centre = mean if mean is not None else 0.0
    return DotPlot(w, None if mean is None else x_of(centre), x_of(centre - std), x_of(centre + std),
                   [Dot(x_of(v), seed, v) for seed, v in values])
