"""`orch web` and `orch report` in a real browser (Debian's Chromium through Playwright) over a
live sweep: real daemon, tmux, SQLite and simulated GPUs. Screenshots of every page go to
test-artifacts/web/."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Orch, orch_env, requires_tmux, wait_until

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
REPO_ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO_ROOT / "test-artifacts" / "web"


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    if not CHROMIUM.exists():
        return "chromium is not installed (apt-get install chromium chromium-driver)"
    return None


# Skipped where the browser is absent on a developer's machine; in CI (env CI set) it runs and fails.
pytestmark = [
    requires_tmux, pytest.mark.tmux, pytest.mark.browser, pytest.mark.slow,
    pytest.mark.skipif(_missing() is not None and not os.environ.get("CI"), reason=str(_missing())),
]


class WebSweep:
    def __init__(self, orch: Orch, url: str, token: str) -> None:
        self.orch, self.url, self.token = orch, url, token

    def counts(self) -> dict[str, int]:
        return {r["state"]: r["n"] for r in self.orch.query("SELECT state, count(*) AS n FROM jobs GROUP BY state")}

    def running_ids(self) -> set[int]:
        return {r["id"] for r in self.orch.query("SELECT id FROM jobs WHERE state = 'running'")}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[WebSweep]:
    # the browser starts first (slow on a loaded machine), so the short jobs are still running
    # when the first page opens
    with orch_env(tmp_path_factory.mktemp("web")) as orch:
        # this checkout's orch, whatever an editable install elsewhere points at
        orch.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        # short jobs end while the page is open; long ones stay running for the cancel test
        orch.write_suite("w", {"short": {"sim_mem_gib": 5, "sim_seconds": 10},
                               "long": {"sim_mem_gib": 5, "sim_seconds": 90}}, mem_gib=6, hang_timeout_s=120)
        orch.submit("w", "1:glue_rte 2:glue_rte", "--gpu-plan", "2,1")
        port = _free_port()
        web = orch.popen("web", "--port", str(port))
        try:
            assert web.stdout is not None
            lines = [web.stdout.readline() for _ in range(3)]
            token = re.search(r"token (\S+)", lines[2])
            assert token, lines
            url = f"http://127.0.0.1:{port}"
            orch.start_daemon()
            yield WebSweep(orch, url, token.group(1))
        finally:
            web.terminate()
            try:
                web.wait(timeout=30)
            except subprocess.TimeoutExpired:
                web.kill()
                web.wait(timeout=30)


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
    finished = {r["id"] for r in sweep.orch.query("SELECT id FROM jobs WHERE state = 'succeeded'")}
    wait_until(lambda: not (_shown_running(page) & finished), 30, "finished jobs to leave the running table")
    assert first_running & finished  # one of the jobs first shown running is the one that ended
    assert page.evaluate("window.__loaded_once") == 42
    assert int(page.evaluate("document.body.dataset.refreshes || '0'")) >= 1


def test_cancel_is_refused_without_the_token_and_works_with_it(sweep: WebSweep, page: Any) -> None:
    long_job = wait_until(lambda: next(iter(
        r["id"] for r in sweep.orch.query("SELECT id FROM jobs WHERE state = 'running' AND config_name = 'long'")), None),
        60, "a long job running")
    action = f"{sweep.url}/api/jobs/{long_job}/cancel"
    assert page.request.post(action).status == 403
    assert page.request.post(action, headers={"X-Orch-Token": "guess"}).status == 403
    assert page.request.get(action).status == 405
    # the button on a page opened without the token is refused too
    page.goto(f"{sweep.url}/job/{long_job}")
    page.click("button:has-text('cancel')")
    wait_until(lambda: "refused" in (page.text_content("#action-result") or ""), 15, "the refusal to show")
    assert sweep.orch.query("SELECT state FROM jobs WHERE id = ?", (long_job,))[0]["state"] == "running"
    # opened with the token it printed, the same button cancels
    page.goto(f"{sweep.url}/job/{long_job}?token={sweep.token}")
    assert "token" not in page.url  # kept for the tab, gone from the address bar and history
    page.click("button:has-text('cancel')")
    wait_until(lambda: sweep.orch.query("SELECT state FROM jobs WHERE id = ?", (long_job,))[0]["state"] == "cancelled",
               60, "the job to be cancelled")
    wait_until(lambda: page.get_attribute("[data-state]", "data-state") == "cancelled", 30, "the job page to show it")
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
        below_bars = box["y"] + box["height"] - 6  # the time axis: a drag that starts on a bar opens its job
        page.mouse.move(box["x"] + box["width"] * 0.6, below_bars)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.9, below_bars, steps=4)
        page.mouse.up()
        return "from=" in page.url

    wait_until(drag_across, 20, "the zoomed range in the address", poll_s=0.5)
    wait_until(lambda: "show the whole sweep" in (page.text_content("#live") or ""), 15, "the zoomed view")


def test_memory_and_results_pages(sweep: WebSweep, page: Any) -> None:
    page.goto(sweep.url + "/memory")
    wait_until(lambda: page.locator("svg.memory g.gpu-memory").count() == 2, 30, "a memory panel per GPU")
    page.screenshot(path=str(ARTIFACTS / "memory.png"), full_page=True)
    wait_until(lambda: sweep.counts().get("succeeded", 0) >= 2, 90, "both short jobs to succeed")
    page.goto(sweep.url + "/results")
    wait_until(lambda: page.locator("table.results tr.result").count() >= 1, 30, "a results row")
    assert page.locator("svg.dots circle.seed").count() >= 2  # the two seeds as points
    csv = page.request.get(sweep.url + "/results.csv").text()
    assert csv.startswith("suite,config,task,metric,mean,std,n_seeds,seeds") and "short" in csv
    page.click("th:has-text('config')")  # sortable: a click orders the rows
    page.screenshot(path=str(ARTIFACTS / "results.png"), full_page=True)


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
        jobs = sweep.orch.query("SELECT count(*) AS n FROM jobs")[0]["n"]
        attempts = len(sweep.orch.attempts())
        assert page.text_content('[data-summary="jobs"]') == str(jobs)
        assert page.text_content('[data-summary="attempts"]') == str(attempts)
        for state, n in sweep.counts().items():
            assert _shown_count(page, state) == n
        assert _bars(page) == attempts
        assert page.locator("svg.memory g.gpu-memory").count() == 2
        assert page.locator("table.results tr.result").count() >= 1
        page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    finally:
        context.close()
    assert requested and all(url.startswith("file:") for url in requested)  # nothing from a network


@pytest.fixture(scope="module", autouse=True)
def _no_leftover_server(sweep: WebSweep) -> Iterator[None]:
    yield
    with contextlib.suppress(Exception):
        sweep.orch.run("cancel", "--all", check=False)
