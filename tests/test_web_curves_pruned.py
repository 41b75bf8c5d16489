"""Curves of pruned runs say where early stopping stopped them: the curves page's data carries each
pruned run's step and reason, the chart draws a ✕ at the last point of the run's line with the
reason as its tooltip (in Chromium), and `Sweep.curves()` has each point's job's `pruned_step`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_pages import ARTIFACTS, BROWSER_MARKS, web_server
from e2e_helpers import wait_until

from benchmarks.web_load import build_sweep
from orchestrator.api import Sweep
from orchestrator.store import Store

RECORD = {"step": 20, "metric": "val_accuracy", "value": 0.41, "rank": 2, "of": 2, "rule": "asha", "rung": 0}
WHY = "pruned at step 20 (val_accuracy 0.41 (the setting's mean over its seeds), ranked 2 of 2 at that step; asha)"
REPO_ROOT = Path(__file__).resolve().parent.parent


def _sweep_with_a_pruned_run(db_path: Path) -> None:
    """Jobs 1 and 2 report val_accuracy at steps 10..40 and 10..25; job 2 was pruned at 20."""
    build_sweep(db_path, 6, running=0, queued=0)
    with Store(db_path) as store, store.write():
        store.execute("UPDATE jobs SET state = 'pruned', pruned_json = ? WHERE id = 2", [json.dumps(RECORD)])
        for job_id, steps in ((1, (10, 20, 30, 40)), (2, (10, 20, 25))):
            attempt = store.query("SELECT max(id) AS id FROM attempts WHERE job_id = ?", [job_id])[0]["id"]
            for step in steps:
                store.execute(
                    "INSERT OR REPLACE INTO metric_history (attempt_id, key, step, value) VALUES (?, ?, ?, ?)",
                    [attempt, "val_accuracy", step, 0.3 + step / 100 if job_id == 1 else 0.2 + step / 100],
                )


def test_the_curves_data_says_which_run_was_pruned_where(db_path: Path) -> None:
    pytest.importorskip("starlette", reason="needs the web extra")
    from starlette.testclient import TestClient

    from orchestrator.web.app import create_app

    _sweep_with_a_pruned_run(db_path)
    with TestClient(create_app(db_path, "t0ken"), base_url="http://127.0.0.1:8765") as client:
        text = client.get("/curves?job=1&job=2&metric=val_accuracy").text
    found = re.search(r'<script type="application/json">(.*?)</script>', text, re.S)
    assert found, text
    runs = {run["key"]: run for run in json.loads(found.group(1))["runs"]}
    assert runs["job-2"]["pruned"] == {"step": 20.0, "why": WHY}
    assert runs["job-1"]["pruned"] is None


def test_sweep_curves_names_each_points_pruned_step(db_path: Path) -> None:
    _sweep_with_a_pruned_run(db_path)
    rows = Sweep(db_path).curves(jobs=[1, 2], keys=["val_accuracy"], as_frame=False)
    assert {(r["job"], r["pruned_step"]) for r in rows} == {(1, None), (2, 20)}
    frame = Sweep(db_path).curves(jobs=[2], keys=["val_accuracy"])
    assert list(frame["pruned_step"]) == [20, 20, 20] and str(frame["pruned_step"].dtype) == "Int64"


class _Web:
    """`orch web` on a database built here (no daemon, no plans)."""

    def __init__(self, db_path: Path) -> None:
        self.env = {**os.environ, "ORCH_DB": str(db_path),
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        self.root = db_path.parent

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "orchestrator", *args], env=self.env, cwd=self.root,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def served(db_path: Path) -> Iterator[str]:
    _sweep_with_a_pruned_run(db_path)
    with web_server(_Web(db_path)) as web:
        yield web.url


def test_a_pruned_run_ends_in_a_cross_with_its_reason(served: str, browser: Any) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        page.goto(served + "/curves?job=1&job=2&metric=val_accuracy")
        chart = page.locator('[data-chart="curves"]')
        wait_until(lambda: chart.get_attribute("data-drawn") == "yes", 30, "the curves chart")
        assert chart.get_attribute("data-series") == "2" and chart.get_attribute("data-pruned") == "1"
        mark = chart.locator(".pruned-mark")
        assert mark.count() == 1 and mark.get_attribute("title") == WHY and mark.inner_text() == "\u2715"
        assert mark.get_attribute("data-run") == "job-2"
        # on job 2's last point (step 25, value 0.45), not job 1's end nor the prune's step
        at = page.evaluate(
            """() => { const box = document.querySelector('[data-chart="curves"]'), u = box._plot;
                       const m = box.querySelector('.pruned-mark');
                       return [parseFloat(m.style.left), parseFloat(m.style.top),
                               u.valToPos(25, 'x'), u.valToPos(0.45, 'y')]; }"""
        )
        assert abs(at[0] - at[2]) < 1 and abs(at[1] - at[3]) < 1, at
        row = chart.locator('table.curve-legend tr[data-run="job-2"]')
        assert row.get_attribute("title") == WHY and "pruned" in (row.get_attribute("class") or "")
        page.screenshot(path=str(ARTIFACTS / "curves-pruned.png"), full_page=True)
        row.locator("input.toggle").uncheck()  # its line hidden: its mark too
        wait_until(lambda: chart.get_attribute("data-pruned") == "0", 10, "the mark gone with its line")
        assert chart.locator(".pruned-mark").count() == 0
    finally:
        context.close()


for _mark in BROWSER_MARKS:  # the browser test alone needs Chromium
    test_a_pruned_run_ends_in_a_cross_with_its_reason = _mark(test_a_pruned_run_ends_in_a_cross_with_its_reason)


@pytest.mark.parametrize(("step", "shown"), [(20, 20.0), (20.5, 20.5), ("20", None), (True, None),
                                             (float("nan"), None), (None, None)])
def test_a_prune_records_step_is_read_as_untrusted_in_one_place(step: Any, shown: float | None) -> None:
    from types import SimpleNamespace

    from orchestrator.api.frames import pruned_step
    from orchestrator.lifecycle import JobState
    from orchestrator.web.views import pruned_at

    job: Any = SimpleNamespace(state=JobState.PRUNED, pruned={"step": step, "metric": "val_accuracy"})
    at = pruned_at(job)
    assert at is not None and at.step == shown and (pruned_step(job) is None) is (shown is None)
    assert pruned_at(SimpleNamespace(state=JobState.SUCCEEDED, pruned={"step": 3})) is None  # type: ignore[arg-type]
