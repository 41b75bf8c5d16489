"""`orch web` and `orch report` in a real browser (Debian's Chromium through Playwright) over a
live sweep: real daemon, tmux, SQLite and simulated GPUs. Screenshots of every page go to
test-artifacts/web/."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from browser_pages import ARTIFACTS, BROWSER_MARKS, web_server
from e2e_helpers import Orch, orch_env, wait_until

from orchestrator.lifecycle import JobState
from orchestrator.store.queries import state_counts

pytestmark = BROWSER_MARKS


class WebSweep:
    def __init__(self, orch: Orch, url: str, token: str) -> None:
        self.orch, self.url, self.token = orch, url, token

    def counts(self) -> dict[str, int]:
        return {state: n for state, n in self.orch.read(state_counts).items() if n}

    def ids(self, *states: JobState, config: str | None = None) -> set[int]:
        """The jobs in one of `states` (any state when none is given), of one config when given."""
        return {job.id for job in self.orch.jobs(*states) if config is None or job.config_name == config}

    def running_ids(self) -> set[int]:
        return self.ids(JobState.RUNNING)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[WebSweep]:
    # the browser starts first (slow on a loaded machine), so the short jobs are still running
    # when the first page opens
    with orch_env(tmp_path_factory.mktemp("web")) as orch:
        # short jobs end while the page is open; long ones stay running for the cancel test
        orch.write_suite("w", {"short": {"sim_mem_gib": 5, "sim_seconds": 10},
                               "long": {"sim_mem_gib": 5, "sim_seconds": 90}}, mem_gib=6, hang_timeout_s=120)
        orch.submit("w", "1:glue_rte 2:glue_rte", "--gpu-plan", "2,1")
        with web_server(orch) as web:
            token = web.token()
            assert token, web.printed
            orch.start_daemon()
            yield WebSweep(orch, web.url, token)


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        yield context.new_page()
    finally:
        context.close()


def _shown_running(page: Any) -> set[int]:
    return {int(x) for x in page.eval_on_selector_all("tr.running-job", "rows => rows.map(r => r.dataset.job)")}


def _shown_count(page: Any, state: str) -> int:
    return int(page.text_content(f'[data-count="{state}"] b') or -1)


def test_overview_lists_running_jobs_and_updates_without_reload(sweep: WebSweep, page: Any) -> None:
    wait_until(lambda: len(sweep.running_ids()) == 3, 60, "three jobs running (plan 2,1)")
    page.goto(sweep.url + "/")
    page.evaluate("window.__loaded_once = 42")  # gone if the page reloads
    # the page shows exactly what runs (both read the database; retried until they agree)
    wait_until(lambda: _shown_running(page) == sweep.running_ids() != set(), 30, "the page to list the running jobs")
    assert page.text_content('tr.running-job td:nth-child(2)')  # suite / config shown
    page.screenshot(path=str(ARTIFACTS / "overview.png"), full_page=True)
    first_running = _shown_running(page)
    # a short job finishes: the page follows, without a reload
    wait_until(lambda: sweep.counts().get("succeeded", 0) >= 1, 60, "a short job to succeed")
    wait_until(lambda: _shown_count(page, "succeeded") == sweep.counts().get("succeeded", 0) >= 1, 30,
               "the succeeded count on the page to follow")
    finished = sweep.ids(JobState.SUCCEEDED)
    wait_until(lambda: not (_shown_running(page) & finished), 30, "finished jobs to leave the running table")
    assert first_running & finished  # one of the jobs first shown running is the one that ended
    assert page.evaluate("window.__loaded_once") == 42
    assert int(page.evaluate("document.body.dataset.refreshes || '0'")) >= 1


def test_cancel_is_refused_without_the_token_and_works_with_it(sweep: WebSweep, page: Any) -> None:
    long_job = wait_until(
        lambda: min(sweep.ids(JobState.RUNNING, config="long"), default=None),
        60,
        "a long job running",
    )
    action = f"{sweep.url}/api/jobs/{long_job}/cancel"
    assert page.request.post(action).status == 403
    assert page.request.post(action, headers={"X-Orch-Token": "guess"}).status == 403
    assert page.request.get(action).status == 405
    # the button on a page opened without the token is refused too, and says so on a page
    page.goto(f"{sweep.url}/job/{long_job}")
    with page.expect_navigation():
        page.click("form.action button:has-text('cancel')")
    assert page.get_attribute(".action-answer", "data-status") == "403"
    assert "refused" in (page.text_content(".action-message") or "") and "{" not in (page.text_content("main") or "")
    assert sweep.orch.job_states()[long_job] == "running"
    # opened with the token it printed, the same button cancels; the answer is a page, not JSON
    page.goto(f"{sweep.url}/job/{long_job}?token={sweep.token}")
    assert "token" not in page.url  # kept for the tab, gone from the address bar and history
    assert page.locator("form.action button").all_text_contents() == ["cancel", "retry"]  # what a running job allows
    with page.expect_navigation():
        page.click("form.action button:has-text('cancel')")
    assert page.get_attribute(".action-answer", "data-status") == "200"
    assert f"job {long_job} is stopping" in (page.text_content(".action-message") or "")  # a running job stops first
    wait_until(lambda: sweep.orch.job_states()[long_job] == "cancelled",
               60, "the job to be cancelled")
    page.click(f"a:has-text('back to job {long_job}')")
    wait_until(lambda: page.get_attribute("[data-state]", "data-state") == "cancelled", 30, "the job page to show it")
    assert page.locator("form.action button").all_text_contents() == ["retry"]  # a cancelled job: retry only
    page.screenshot(path=str(ARTIFACTS / "job.png"), full_page=True)


def _bars(page: Any) -> int:
    return int(page.eval_on_selector_all("svg.timeline g.attempt", "bars => bars.length"))


def test_timeline_has_one_bar_per_attempt(sweep: WebSweep, page: Any) -> None:
    page.goto(sweep.url + "/timeline")
    wait_until(lambda: _bars(page) == len(sweep.orch.attempts()) > 0, 30, "one bar per attempt")
    title = page.text_content("svg.timeline g.attempt title") or ""
    assert "seed" in title and "peak" in title and "level" in title
    page.screenshot(path=str(ARTIFACTS / "timeline.png"), full_page=True)
    # drag across the chart: the view zooms to that time range without a reload

    def drag_across() -> bool:
        # the chart grows while attempts start, so measure it right before each try
        box = page.locator("svg.timeline").bounding_box()
        if box is None:  # a live redraw swapped the chart out between finding it and measuring it
            return False
        below_bars = box["y"] + box["height"] - 6  # the time axis: a drag that starts on a bar opens its job
        page.mouse.move(box["x"] + box["width"] * 0.6, below_bars)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.9, below_bars, steps=4)
        page.mouse.up()
        return "from=" in page.url

    wait_until(drag_across, 20, "the zoomed range in the address", poll_s=0.5)
    wait_until(lambda: "show the whole sweep" in (page.text_content("#live") or ""), 15, "the zoomed view")


def _memory_charts_drawn(page: Any) -> int:
    return int(page.locator('.gpu-memory [data-chart="memory"][data-drawn="yes"]').count())


def test_memory_chart_has_time_and_gib_axes_a_band_per_job_and_a_legend(sweep: WebSweep, page: Any) -> None:
    wait_until(lambda: len(sweep.running_ids()) >= 1, 60, "a job running")
    page.goto(sweep.url + "/memory")
    wait_until(lambda: _memory_charts_drawn(page) == 2, 30, "a memory chart per GPU, drawn by uPlot")
    # the samples name the jobs that held memory: wait until a drawn chart has a band for one
    wait_until(lambda: (page.reload() or True) and _memory_charts_drawn(page) == 2 and re.search(
        r"job \d+ · (short|long)", page.text_content(".gpu-memory .u-legend") or ""), 30, "a band named for a job")
    chart = page.locator(".gpu-memory").first
    assert chart.locator(".u-axis").count() == 2  # time and memory
    time_axis, memory_axis = json.loads(chart.locator('[data-chart="memory"]').get_attribute("data-axes"))
    assert time_axis["label"] == "time (UTC)" and memory_axis["label"] == "GPU memory (GiB)"
    assert memory_axis["ticks"] and all(re.fullmatch(r"[\d.]+ GiB", t) for t in memory_axis["ticks"])
    assert memory_axis["ticks"][0] == "0 GiB" and len(memory_axis["ticks"]) >= 3
    assert any(re.search(r"\d:\d\d", t) for t in time_axis["ticks"]), time_axis
    legend = chart.locator(".u-legend").inner_text()
    assert "foreign" in legend and "free" in legend
    page.screenshot(path=str(ARTIFACTS / "memory.png"), full_page=True)
    # drag across the chart to zoom; the zoom survives the page's live redraws
    first_chart = page.locator('.gpu-memory [data-chart="memory"]').first

    def drag_to_zoom() -> bool:
        box = chart.locator(".u-over").bounding_box()
        if box is None:  # a live redraw swapped the chart out between finding it and measuring it
            return False
        page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] / 2)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + box["height"] / 2, steps=5)
        page.mouse.up()
        return True

    wait_until(drag_to_zoom, 20, "the memory chart in place to drag across", poll_s=0.5)
    refreshes = int(page.evaluate("document.body.dataset.refreshes || '0'"))
    wait_until(lambda: int(page.evaluate("document.body.dataset.refreshes || '0'")) > refreshes, 30,
               "a live redraw (a new memory sample)")
    wait_until(lambda: _memory_charts_drawn(page) == 2, 15, "the charts drawn again")
    assert first_chart.get_attribute("data-zoomed") == "yes"


def test_jobs_page_filters_and_is_one_click_from_the_counts(sweep: WebSweep, page: Any) -> None:
    page.goto(sweep.url + "/")
    wait_until(lambda: _shown_count(page, "queued") >= 0, 15, "the counts")
    with page.expect_navigation():
        page.click('[data-count="succeeded"]')
    assert page.url.endswith("/jobs?state=succeeded")

    def shown(state: str) -> set[int]:
        return {int(x) for x in page.eval_on_selector_all(
            f'tr.job-row[data-state="{state}"]', "rows => rows.map(r => r.dataset.job)")}

    listed = {int(x) for x in page.eval_on_selector_all("tr.job-row", "rows => rows.map(r => r.dataset.job)")}
    in_db = sweep.ids(JobState.SUCCEEDED)
    assert listed == shown("succeeded") and listed <= in_db  # only succeeded jobs (more may finish meanwhile)
    # filter by config through the form: every job of that config, in any state
    page.goto(sweep.url + "/jobs")
    page.select_option('select[data-filter="config"]', "long")
    with page.expect_navigation():
        page.click("form.filters button")
    assert "config=long" in page.url
    longs = sweep.ids(config="long")
    assert {int(x) for x in page.eval_on_selector_all("tr.job-row", "rows => rows.map(r => r.dataset.job)")} == longs
    assert page.get_attribute("[data-jobs-total]", "data-jobs-total") == str(len(longs))
    page.screenshot(path=str(ARTIFACTS / "jobs.png"), full_page=True)


def test_curves_overlay_picked_runs_with_log_scale_and_a_seed_band(sweep: WebSweep, page: Any) -> None:
    shorts = wait_until(
        lambda: (
            sorted(sweep.ids(JobState.SUCCEEDED, config="short"))
            if sweep.counts().get("succeeded", 0) >= 2
            else None
        ),
        90,
        "both short jobs to succeed",
    )
    page.goto(sweep.url + "/jobs?config=short")
    for job_id in shorts:
        page.check(f'input[name="job"][value="{job_id}"]')
    with page.expect_navigation():
        page.click("form.pick-runs button")
    chart = page.locator('[data-chart="curves"]')
    wait_until(lambda: chart.get_attribute("data-drawn") == "yes", 15, "the curves chart")
    assert chart.get_attribute("data-series") == str(len(shorts)) == "2"  # one line per picked run
    assert chart.get_attribute("data-metric") == "loss"
    rows = chart.locator("table.curve-legend tbody tr")  # a compact table, a row per run with a toggle
    assert sorted(int(r.split("-")[1]) for r in rows.evaluate_all("rs => rs.map(r => r.dataset.run)")) == shorts
    assert rows.first.locator("input.toggle").is_checked() and "short" in rows.first.inner_text()
    assert "test_accuracy" in chart.locator("select.metric").inner_text()  # any metric the worker reports
    chart.locator("input.log").check()
    wait_until(lambda: chart.get_attribute("data-log") == "yes", 10, "a log scale")
    chart.locator("input.band").check()  # seeds of one config: a band (max, min) and its mean
    wait_until(lambda: chart.get_attribute("data-series") == "3", 10, "one band")
    assert "mean (n=2 seeds)" in chart.locator(".u-legend").inner_text()
    page.screenshot(path=str(ARTIFACTS / "curves.png"), full_page=True)


def test_results_pivot_has_a_row_per_config_and_a_column_per_task(sweep: WebSweep, page: Any) -> None:
    wait_until(lambda: sweep.counts().get("succeeded", 0) >= 2, 90, "both short jobs to succeed")
    page.goto(sweep.url + "/results")
    wait_until(lambda: page.locator("table.pivot tr.pivot-row").count() >= 1, 30, "a pivot row")
    assert page.locator("table.pivot thead th[data-task]").all_text_contents()[0].startswith("glue_rte")
    short = page.locator('table.pivot tr.pivot-row[data-config="short"] td')
    assert short.count() == 1 and short.first.get_attribute("data-n") == "2"  # both seeds in the cell
    assert re.search(r"\d\.\d{4} ± \d\.\d{4}", short.first.inner_text())
    assert short.first.inner_text().endswith("· n 2")  # the cell's denominator: both seeds submitted counted
    val = page.locator("table.results tr.result:has(td:text-is('short')) td.val").first.inner_text()
    assert re.fullmatch(r"\d\.\d{4} ± \d\.\d{4}", val.strip())  # the val mean beside the test mean
    assert page.locator("svg.dots circle.seed").count() >= 2  # the two seeds as points
    csv = page.request.get(sweep.url + "/results.csv").text()
    assert csv.startswith("suite,config,task,metric,mean,std,n_seeds,seeds") and "short" in csv
    page.click("table.results th:has-text('config')")  # sortable: a click orders the rows
    page.screenshot(path=str(ARTIFACTS / "results.png"), full_page=True)


def test_every_page_fits_800_px(sweep: WebSweep, browser: Any) -> None:
    context = browser.new_context(viewport={"width": 800, "height": 900})
    try:
        page = context.new_page()
        job = min(sweep.ids())
        for path in ("/", "/jobs", "/timeline", "/memory", "/curves?config=short", "/results", f"/job/{job}"):
            page.goto(sweep.url + path)
            page.wait_for_load_state("load")
            # nothing but a table's own scroll box may be wider than the window
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= 800, (path, wide)
            name = path.strip("/").split("?")[0].replace("/", "-") or "overview"
            page.screenshot(path=str(ARTIFACTS / f"800px-{name}.png"), full_page=True)
    finally:
        context.close()


def test_report_opens_offline_and_shows_the_same_counts(sweep: WebSweep, browser: Any) -> None:
    sweep.orch.run("cancel", "--all")
    sweep.orch.wait_all_done(90)
    out = sweep.orch.root / "sweep.html"
    sweep.orch.run("report", "--out", str(out))
    context = browser.new_context(offline=True, viewport={"width": 1280, "height": 900})
    requested: list[str] = []
    context.on("request", lambda request: requested.append(request.url))
    try:
        page = context.new_page()
        page.goto(out.as_uri())
        jobs = len(sweep.ids())
        attempts = len(sweep.orch.attempts())
        assert page.text_content('[data-summary="jobs"]') == str(jobs)
        assert page.text_content('[data-summary="attempts"]') == str(attempts)
        for state, n in sweep.counts().items():
            assert _shown_count(page, state) == n
        assert _bars(page) == attempts
        wait_until(lambda: _memory_charts_drawn(page) == 2, 15, "the memory charts, drawn offline")
        assert page.locator(".gpu-memory .u-axis").count() == 4
        assert page.locator("table.results tr.result").count() >= 1
        assert page.locator("table.pivot tr.pivot-row").count() >= 1
        assert page.locator('#curves [data-chart="curves"][data-drawn="yes"]').count() == 1
        page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    finally:
        context.close()
    assert requested and all(url.startswith("file:") for url in requested)  # nothing from a network


@pytest.fixture(scope="module", autouse=True)
def _no_leftover_server(sweep: WebSweep) -> Iterator[None]:
    yield
    with contextlib.suppress(Exception):
        sweep.orch.run("cancel", "--all", check=False)
