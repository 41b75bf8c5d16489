"""The web page read as a person reads it, in a real browser (Chromium through Playwright) over
a finished sweep of 16 jobs on a real daemon, tmux, SQLite and simulated GPUs: memory-chart
time labels that never run together (page and report, 1,280 px), a colour per job (its
config's hue, its seed's shade), timeline labels readable at 800 px, a reason column that does
not wrap a word per line, and a job's log opened at its end with progress-bar redraws
collapsed. Screenshots go to test-artifacts/web/reading-*.png."""

from __future__ import annotations

import colorsys
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_pages import ARTIFACTS, BROWSER_MARKS, web_server
from e2e_helpers import Orch, orch_env, wait_until

from orchestrator.lifecycle import JobState
from orchestrator.rundir_files import RunDir

pytestmark = BROWSER_MARKS
CONFIGS = ("alpha", "beta", "gamma")
SEEDS = "1:glue_rte 2:glue_rte 3:glue_rte 4:glue_rte"


class Reading:
    def __init__(self, orch: Orch, url: str) -> None:
        self.orch, self.url = orch, url


@pytest.fixture(scope="module")
def done_sweep(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[Reading]:
    with orch_env(tmp_path_factory.mktemp("reading")) as orch:
        jobs: dict[str, dict[str, Any]] = {name: {"sim_mem_gib": 2 + i, "sim_seconds": 4 + 2 * i}
                                           for i, name in enumerate(CONFIGS)}
        jobs["broken"] = {"sim_mem_gib": 1, "sim_seconds": 2, "sim_fail": "error"}
        orch.write_suite("r", jobs, mem_gib=4, max_attempts=1)
        orch.submit("r", SEEDS, "--gpu-plan", "3,3")
        orch.start_daemon()
        orch.wait_all_done(240)
        with web_server(orch) as web:
            yield Reading(orch, web.url)


def _page(browser: Any, width: int) -> Any:
    return browser.new_context(viewport={"width": width, "height": 900})


def _time_axes(page: Any) -> list[dict[str, Any]]:
    wait_until(lambda: page.locator('[data-chart="memory"][data-drawn="yes"]').count() == 2, 30, "both memory charts")
    return [json.loads(axes)[0] for axes in page.eval_on_selector_all(
        '[data-chart="memory"]', "charts => charts.map(c => c.dataset.axes)")]


def _apart(axis: dict[str, Any]) -> None:
    """The time labels are distinct and each sits at least its width (plus a gap) from the next."""
    ticks, pos = axis["ticks"], axis["pos"]
    assert len(ticks) >= 2 and len(set(ticks)) == len(ticks), axis
    assert all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", t) for t in ticks), axis
    gaps = [b - a for a, b in itertools.pairwise(pos)]
    assert min(gaps) >= axis["label_px"] + 8, axis


def test_memory_time_labels_never_run_together_at_1280_px(done_sweep: Reading, browser: Any) -> None:
    context = _page(browser, 1280)
    try:
        page = context.new_page()
        page.goto(done_sweep.url + "/memory")
        for axis in _time_axes(page):
            _apart(axis)
        page.screenshot(path=str(ARTIFACTS / "reading-memory-1280.png"), full_page=True)
        out = done_sweep.orch.root / "reading.html"
        done_sweep.orch.run("report", "--out", str(out))
        page.goto(out.as_uri())
        for axis in _time_axes(page):
            _apart(axis)
        page.locator("#memory").screenshot(path=str(ARTIFACTS / "reading-report-memory-1280.png"))
    finally:
        context.close()


def _hsl(colour: str) -> tuple[float, float]:
    """(hue, lightness) of `hsl(h, s%, l%)` or `#rrggbb`."""
    if match := re.fullmatch(r"hsl\((\d+), (\d+)%, (\d+)%\)", colour):
        return float(match.group(1)), float(match.group(3))
    r, g, b = (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    h, lightness, _ = colorsys.rgb_to_hls(r, g, b)
    return round(h * 360), round(lightness * 100)


def test_every_job_has_its_own_colour_and_a_config_its_hue(done_sweep: Reading, browser: Any) -> None:
    context = _page(browser, 1280)
    try:
        page = context.new_page()
        page.goto(done_sweep.url + "/memory")
        _time_axes(page)
        specs = [json.loads(text) for text in page.eval_on_selector_all(
            '[data-chart="memory"] script', "scripts => scripts.map(s => s.textContent)")]
        colour_of: dict[int, str] = {}
        for spec in specs:
            for band in spec["bands"]:
                if band["job"] is not None:  # the same job, the same colour on every card
                    assert colour_of.setdefault(band["job"], band["colour"]) == band["colour"]
        config_of = {job.id: job.config_name for job in done_sweep.orch.jobs()}
        assert len(colour_of) >= 10 and len(set(colour_of.values())) == len(colour_of)  # no two jobs alike
        hues: dict[str, set[float]] = {}
        for job_id, colour in colour_of.items():
            hues.setdefault(config_of[job_id], set()).add(_hsl(colour)[0])
        assert all(len(h) == 1 for h in hues.values()), hues  # seeds of a config: shades of one hue
        # configs: hues well apart. The broken config's jobs fail within a second or two and may
        # end before a memory sample is taken (under load they often do): they need not be drawn.
        assert set(CONFIGS) <= set(hues), hues
        config_hues = sorted(next(iter(h)) for h in hues.values())
        assert min(b - a for a, b in itertools.pairwise(config_hues)) >= 40, hues
        legend = page.locator(".gpu-memory").first.locator(".u-legend")
        assert re.search(r"job \d+ · (alpha|beta|gamma)", legend.inner_text())
        page.locator(".gpu-memory").first.screenshot(path=str(ARTIFACTS / "reading-memory-colours.png"))
    finally:
        context.close()


def test_timeline_labels_are_readable_at_800_px(done_sweep: Reading, browser: Any) -> None:
    context = _page(browser, 800)
    try:
        page = context.new_page()
        page.goto(done_sweep.url + "/timeline")
        wait_until(lambda: page.locator("svg.timeline g.attempt").count() == len(done_sweep.orch.attempts()), 30,
                   "a bar per attempt")
        # the rendered size of each kind of label: its font size scaled by the drawing's width on screen
        sizes = page.evaluate("""() => {
            const svg = document.querySelector('svg.timeline');
            const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
            const px = sel => [...svg.querySelectorAll(sel)].map(t => parseFloat(getComputedStyle(t).fontSize) * scale);
            return {bar: px('text.bar-label'), tick: px('text.tick-label'), lane: px('text.lane-label')};
        }""")
        assert sizes["bar"] and sizes["tick"] and sizes["lane"], sizes
        assert min(sizes["bar"] + sizes["tick"] + sizes["lane"]) >= 10.0, sizes
        assert page.evaluate("document.documentElement.scrollWidth") <= 800
        page.screenshot(path=str(ARTIFACTS / "reading-timeline-800.png"), full_page=True)
    finally:
        context.close()


# Each cell's words, lines and width, once every cell of several words is laid out: the page's
# live refresh swaps its fragment, and a cell measured mid-swap reads 0 wide.
_MEASURE_CELLS = """selector => {
    const cells = Array.from(document.querySelectorAll(selector)).map(c => ({
        words: c.textContent.trim().split(/\\s+/).length,
        lines: Math.round(c.getBoundingClientRect().height / parseFloat(getComputedStyle(c).lineHeight || 20)),
        width: c.getBoundingClientRect().width}));
    return cells.some(c => c.words >= 6) && cells.every(c => c.words < 6 || c.width > 0) ? cells : null;
}"""


def _laid_out_cells(page: Any, selector: str) -> list[dict[str, float]]:
    try:
        return page.wait_for_function(_MEASURE_CELLS, arg=selector, timeout=15_000).json_value()
    except Exception:  # not laid out in time: the assertions below say what was seen
        return page.evaluate(_MEASURE_CELLS.replace("? cells : null", "? cells : cells"), selector)


def test_the_reason_column_keeps_words_together_at_800_px(done_sweep: Reading, browser: Any) -> None:
    context = _page(browser, 800)
    try:
        page = context.new_page()
        page.goto(done_sweep.url + "/jobs?state=failed")
        cells = _laid_out_cells(page, "td.reason")
        gpus = page.eval_on_selector_all("tr.job-row", "rows => rows.map(r => r.cells[10].textContent.trim())")
        assert gpus and all(g in ("0", "1") for g in gpus), gpus  # the card each failed job ran on
        long = [c for c in cells if c["words"] >= 6]
        assert long, cells  # the failed jobs' reasons
        for cell in long:  # several words to a line, not one
            assert cell["width"] >= 200 and cell["lines"] <= cell["words"] / 3, cell
        assert page.evaluate("document.documentElement.scrollWidth") <= 800
        page.screenshot(path=str(ARTIFACTS / "reading-jobs-800.png"), full_page=True)
    finally:
        context.close()


def test_the_attempts_reason_keeps_words_together_at_800_px(done_sweep: Reading, browser: Any) -> None:
    failed = [job.id for job in done_sweep.orch.jobs(JobState.FAILED)]
    assert failed
    context = _page(browser, 800)
    try:
        page = context.new_page()
        page.goto(f"{done_sweep.url}/job/{failed[0]}")
        cells = _laid_out_cells(page, "table.attempts tr.attempt-row td:last-child")
        long = [c for c in cells if c["words"] >= 6]
        assert long, cells  # the failed attempt's reason
        for cell in long:  # several words to a line, not one
            assert cell["width"] >= 200 and cell["lines"] <= cell["words"] / 3, cell
        page.screenshot(path=str(ARTIFACTS / "reading-job-800.png"), full_page=True)
    finally:
        context.close()


def _bar(i: int) -> str:
    return f"\r{i:3d}%|{'#' * (i // 5):<20}| {i}/100 [00:0{i // 20}<00:05, 19.8it/s]"


def test_the_job_log_opens_at_its_end_with_redraws_collapsed(done_sweep: Reading, browser: Any) -> None:
    job = min(j.id for j in done_sweep.orch.jobs(JobState.SUCCEEDED))
    run_dir = Path(done_sweep.orch.attempts(job)[-1]["run_dir"])
    # what a tqdm script leaves: a bar redrawn a hundred times per epoch, then the result
    lines = ["loading the model", *(f"epoch {e}: " + "".join(_bar(i) for i in range(101)) for e in range(1, 4)),
             *(f"eval step {k}: loss 0.{k:03d}" for k in range(150)), '{"accuracy": 0.91}']
    RunDir(run_dir).log.write_text("\n".join(lines) + "\n")
    context = _page(browser, 1280)
    try:
        page = context.new_page()
        page.goto(done_sweep.url + f"/job/{job}")
        log = page.locator("pre.log")
        text = log.inner_text()
        assert text.rstrip().endswith('{"accuracy": 0.91}')
        bars = [line for line in text.splitlines() if "%|" in line]
        # each epoch's bar at its last state (a terminal's \r also overwrote the "epoch N: " before it)
        assert bars == ["100%|####################| 100/100 [00:05<00:05, 19.8it/s]"] * 3
        at_end = "el => el.scrollTop + el.clientHeight >= el.scrollHeight - 4 && el.scrollHeight > el.clientHeight"
        wait_until(lambda: log.evaluate(at_end), 10, "the log scrolled to its end")
        page.screenshot(path=str(ARTIFACTS / "reading-job-log.png"), full_page=True)
        with page.expect_navigation():
            page.click("a.whole-log")
        whole = page.inner_text("body")
        assert whole.startswith("loading the model") and whole.count("%|") == 3 and "eval step 0: loss" in whole
        raw = page.request.get(done_sweep.url + f"/job/{job}/log?raw=1").body()
        assert raw.count(b"\r") == 303 and raw.endswith(b'{"accuracy": 0.91}\n')
        assert page.request.get(done_sweep.url + f"/job/{job}/log?attempt=9").status == 400
    finally:
        context.close()
