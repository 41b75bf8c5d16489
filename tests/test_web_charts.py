"""The web page's pure parts: memory chart data, curves from progress.jsonl, seed bands, the
results pivot and its label for an effective config, the timeline's labels and ticks."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from run_dirs import private_attempt_dir

from orchestrator.results.aggregate import ResultRow, aggregate
from orchestrator.store.gpu_samples import GpuSample
from orchestrator.store.web_queries import AttemptSpan, OomMark
from orchestrator.web.charts import LEFT, RIGHT, WIDTH, bar_label, time_ticks, timeline_layout
from orchestrator.web.curves import Curve, Run, chart_spec, parse_curves, seed_bands
from orchestrator.web.memory_chart import memory_charts
from orchestrator.web.results_view import effective_config_label, pivot


def sample(ts: float, gpu: int, holds: dict[int, int], used: int = 10_000, total: int = 24_576) -> GpuSample:
    ours = sum(holds.values())
    return GpuSample(ts, gpu, f"GPU-{gpu}", total, used, ours, total - used, holds)


def test_memory_chart_splits_ours_per_job_and_keeps_every_mib() -> None:
    samples = [sample(0, 0, {1: 3000, 2: 2000}), sample(1, 0, {2: 4000}), sample(1, 1, {}, used=500)]
    ooms = [OomMark(0.5, 0, 1, 1, "big", "oom"), OomMark(1.0, 1, 9, 2, "x", "oom"), OomMark(-5, 0, 3, 1, "old", "oom")]
    gpu0, gpu1 = memory_charts(samples, ooms, {1: "job 1 · big", 2: "job 2 · small"})
    assert [b.label for b in gpu0.bands] == ["job 1 · big", "job 2 · small", "foreign", "free"]
    assert [b.mib for b in gpu0.bands[:2]] == [[3000, 0], [2000, 4000]]
    for i, s in enumerate(samples[:2]):  # the bands stack up to the card's total, at every sample
        assert sum(b.mib[i] for b in gpu0.bands) == s.total_mib
    assert [o.job_id for o in gpu0.ooms] == [1]  # its own card's, inside the chart's time
    assert [o.job_id for o in gpu1.ooms] == [9] and [b.label for b in gpu1.bands] == ["foreign", "free"]
    assert json.loads(json.dumps(gpu0.to_json()))["ooms"][0]["label"] == "OOM: job 1 attempt 1 · big"


def test_memory_chart_sums_jobs_beyond_the_limit_into_one_named_band() -> None:
    samples = [sample(0, 0, {j: 100 * j for j in range(1, 8)}, used=20_000)]
    (chart,) = memory_charts(samples, [], {}, max_jobs=3)
    assert [b.label for b in chart.bands[:4]] == ["job 5", "job 6", "job 7", "4 other jobs"]
    assert chart.bands[3].mib == [100 + 200 + 300 + 400]
    assert sum(b.mib[0] for b in chart.bands) == 24_576


def test_samples_from_before_the_split_show_ours_as_one_band() -> None:
    old = GpuSample(0, 0, "GPU-0", 24_576, 9000, 6000, 15_576)  # no holds recorded
    (chart,) = memory_charts([old], [], {})
    assert [(b.label, b.mib) for b in chart.bands][:2] == [("ours (not split by job)", [6000]), ("foreign", [3000])]


def test_curves_read_every_metric_a_worker_reports_and_nothing_else() -> None:
    lines = [
        json.dumps({"t": 1.0, "step": 1, "total": 9, "loss": 2.0, "samples_per_s": 10, "eval_acc": None}),
        '{"step": 2, "loss": NaN, "eval_acc": 0.5, "name": "text"}',
        "not json", "[1, 2]", '{"step": "3", "loss": 1}',
        json.dumps({"step": 3, "loss": 1.5, "x" * 100: 1.0, "flag": True}),
        '{"step": 4, "loss": 1e999}',
    ]
    curves = parse_curves("\n".join(lines))
    assert list(curves) == ["loss", "eval_acc", "samples_per_s"]  # loss first, the rest by name
    assert curves["loss"] == Curve([1.0, 3.0], [2.0, 1.5])
    assert curves["eval_acc"] == Curve([2.0], [0.5])


def test_curves_are_thinned_and_metrics_bounded() -> None:
    text = "\n".join(json.dumps({"step": s, **{f"m{k}": s for k in range(40)}}) for s in range(1000))
    curves = parse_curves(text, max_points=100)
    assert len(curves) == 24 and all(len(c.steps) <= 101 for c in curves.values())
    assert curves["m0"].steps[-1] == 999  # the last point is kept


def test_seeds_of_one_config_make_a_band_of_mean_min_and_max() -> None:
    runs = [Run("a", "seed 1", "c", {"loss": Curve([0, 10], [2.0, 1.0])}),
            Run("b", "seed 2", "c", {"loss": Curve([0, 5, 10], [4.0, 2.0, 3.0])}),
            Run("c", "seed 1", "other", {"loss": Curve([0, 20], [1.0, 1.0])}),
            Run("d", "no loss", "c", {"acc": Curve([0], [0.5])})]
    band, other = seed_bands(runs, "loss")
    assert (band.label, band.n, other.n) == ("c", 2, 1)
    assert band.steps == [0, 5, 10]
    assert band.mean == [3.0, 1.75, 2.0]  # at step 5 seed 1 is interpolated to 1.5
    assert band.lo == [2.0, 1.5, 1.0] and band.hi == [4.0, 2.0, 3.0]
    spec = chart_spec(runs, key="k")
    assert spec["metrics"] == ["loss", "acc"] and len(spec["bands"]["loss"]) == 2


def test_a_seeds_rerun_replaces_its_earlier_run_in_the_band_never_adds_a_seed() -> None:
    def run(job: int, seed: int, loss: float, succeeded: bool = True) -> Run:
        return Run(f"job-{job}", f"job {job}", "c", {"loss": Curve([0, 10], [loss, loss])}, seed=seed, job=job,
                   succeeded=succeeded)

    # 3 seeds, seed 1 forced twice (jobs 4 and 5) and seed 2's rerun failed (job 6)
    runs = [run(1, 1, 1.0), run(2, 2, 2.0), run(3, 3, 3.0), run(4, 1, 5.0), run(5, 1, 7.0), run(6, 2, 9.0, False)]
    (band,) = seed_bands(runs, "loss")
    assert band.n == 3  # seeds, not runs (it read 6 before)
    assert band.mean == [(7.0 + 2.0 + 3.0) / 3] * 2  # seed 1's latest job, seed 2's succeeded one


def test_curve_colours_never_use_the_oom_red() -> None:
    from orchestrator.web.charts import OUTCOME_COLOURS
    from orchestrator.web.curves import PALETTE

    assert OUTCOME_COLOURS["oom"] not in PALETTE


@dataclass(frozen=True)
class SummaryWithOverrides:
    """A summary as the results model names an effective config's --set overrides."""

    config: str
    overrides: dict[str, Any] = field(default_factory=dict)
    overrides_label: str | None = None


def test_a_row_is_labelled_with_its_config_and_overrides() -> None:
    assert effective_config_label(SummaryWithOverrides("base")) == "base"
    assert effective_config_label(SummaryWithOverrides("base", {"learning_rate": 0.001, "a": 1})) == \
        "base [a=1 learning_rate=0.001]"
    assert effective_config_label(SummaryWithOverrides("base", {"x": 1}, "lr=1e-3")) == "base [lr=1e-3]"


def test_pivot_is_configs_by_tasks_with_the_best_mean_of_each_task_with_two_seeds() -> None:
    rows = [ResultRow("E1", c, t, s, {"accuracy": v, "f1": v - 0.1})
            for c, t, s, v in [("a", "glue_rte", 1, 0.6), ("a", "glue_rte", 2, 0.8), ("b", "glue_rte", 1, 0.9),
                               ("a", "glue_mrpc", 1, 0.5)]]
    p = pivot(aggregate(rows))
    assert p.columns == [("glue_mrpc", "f1"), ("glue_rte", "accuracy")]
    assert [r.label for r in p.rows] == ["a", "b"]
    a, b = p.rows
    assert a.cells[0] is not None and a.cells[0].n == 1 and not a.cells[0].best  # one seed: never bold
    assert a.cells[0].std is None  # shown `—`, never ± 0
    assert a.cells[1] is not None and a.cells[1].mean == pytest.approx(0.7) and a.cells[1].n == 2 and a.cells[1].best
    assert b.cells[0] is None and b.cells[1] is not None and not b.cells[1].best  # 0.9 from a single seed
    losses = pivot(aggregate([ResultRow("E1", c, "toy", s, {"loss": v}) for c, s, v in
                              [("a", 1, 0.5), ("a", 2, 0.7), ("b", 1, 0.2), ("b", 2, 0.4)]]))
    assert [r.cells[0].best for r in losses.rows if r.cells[0] is not None] == [False, True]  # the lowest loss
    several = pivot(aggregate([*rows, ResultRow("E2", "a", "glue_rte", 1, {"accuracy": 0.1})]))
    assert [r.label for r in several.rows] == ["E1/a", "E1/b", "E2/a"]  # suites apart when there are several
    mixed = pivot(aggregate([ResultRow("E1", "a", "glue_rte", 1, {"accuracy": 0.5}, level=0),
                             ResultRow("E1", "a", "glue_rte", 2, {"accuracy": 0.6}, level=1)]))
    # seeds at two levels share one cell; an inexact rung among them is its mark (none here)
    assert mixed.rows[0].cells[0] is not None and mixed.rows[0].cells[0].n == 2
    assert mixed.rows[0].cells[0].marks == ""


def span(attempt_id: int, start: float, end: float, config: str = "cfg") -> AttemptSpan:
    return AttemptSpan(attempt_id, 40 + attempt_id, 1, 0, 2, None, "succeeded", start, end, "s", config, 1, "d", 1, 1)


def test_bars_name_job_and_config_where_they_fit() -> None:
    s = span(1, 0, 1, config="large-config")
    assert bar_label(s, 500) == "L2 · job 41 · large-config"
    assert bar_label(s, 160) == "job 41 · large-config"
    assert bar_label(s, 50) == "job 41"
    assert bar_label(s, 20) == "L2"
    assert bar_label(s, 5) == ""
    layout = timeline_layout([span(1, 0, 100), span(2, 99, 100)], 0, 100, 100)
    labels = {b.span.job_id: b.label for b in layout.bars}
    assert labels[41] == "L2 · job 41 · cfg" and labels[42] == ""


def test_the_last_tick_label_stays_inside_the_chart() -> None:
    plot_w = WIDTH - LEFT - RIGHT
    ticks = time_ticks(0, 60.5, LEFT, plot_w)  # a tick at 60 s, right at the edge
    assert ticks[-1].label == "00:01:00" and ticks[-1].anchor == "end"
    assert all(t.anchor == "middle" for t in ticks[:-1])


def test_curves_are_read_from_the_run_dir_itself_never_through_a_symlink(  # type: ignore[no-untyped-def]
    tmp_path
) -> None:
    from orchestrator.web.curves import read_curves

    run_dir = private_attempt_dir(tmp_path)
    line = json.dumps({"step": 1, "loss": 1.0, "eval_f1": 0.5}) + "\n"
    (run_dir / "progress.jsonl").write_text(line)
    assert set(read_curves(run_dir)) == {"loss", "eval_f1"}
    (run_dir / "progress.jsonl").unlink()
    (tmp_path / "elsewhere.jsonl").write_text(line)
    (run_dir / "progress.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    assert read_curves(run_dir) == {}
    assert read_curves(tmp_path / "missing") == {}


def test_a_job_takes_its_configs_hue_and_a_shade_for_its_seed() -> None:
    from orchestrator.web.colours import config_hue, job_colours

    colours = job_colours({1: "a", 2: "a", 3: "a", 4: "b", 5: "c"})
    assert len(set(colours.values())) == 5
    hue = {job: int(colour.split("(")[1].split(",")[0]) for job, colour in colours.items()}
    assert hue[1] == hue[2] == hue[3] != hue[4] != hue[5] != hue[1]
    lightness = [int(colours[j].rsplit(" ", 1)[1].rstrip("%)")) for j in (1, 2, 3)]
    assert lightness == sorted(lightness) and lightness[0] < lightness[-1]  # seeds dark to light
    hues = sorted(config_hue(i) for i in range(6))
    assert all(60 <= h <= 330 for h in hues)  # no reds or oranges: those are OOMs and foreign memory
    assert min(b - a for a, b in itertools.pairwise(hues)) >= 20  # six configs, apart
    (chart,) = memory_charts([sample(0, 0, {1: 100, 4: 200})], [], {}, configs={1: "a", 4: "b"})
    two = job_colours({1: "a", 4: "b"})
    assert [b.colour for b in chart.bands[:2]] == [two[1], two[4]]


def test_a_log_shows_each_redrawn_line_at_its_last_state() -> None:
    from orchestrator.web.log_text import collapse_redraws, collapsed_chunks, log_tail

    bar = "".join(f"\r{i}%|{'#' * (i // 10)}" for i in range(101))
    text = f"start\nepoch 1{bar}\ncrlf line\r\nTraceback (most recent call last):\nValueError: x\n"
    assert collapse_redraws(text).split("\n") == ["start", "100%|##########", "crlf line",
                                                  "Traceback (most recent call last):", "ValueError: x", ""]
    assert log_tail(text, 2, cut_at_start=False) == "ValueError: x\n"
    assert log_tail("half a line\nwhole\n", 10, cut_at_start=True) == "whole\n"
    data = text.encode()
    for size in (1, 3, 7, 64, len(data)):  # any chunking gives the same lines
        chunks = [data[i:i + size] for i in range(0, len(data), size)]
        assert b"".join(collapsed_chunks(chunks)).decode() == collapse_redraws(text)
    # a line redrawn a million times holds two states, not a million
    endless = (b"\r" + b"x" * 50) * 1_000_000
    out = list(collapsed_chunks(endless[i:i + 65536] for i in range(0, len(endless), 65536)))
    assert out == [b"x" * 50]
