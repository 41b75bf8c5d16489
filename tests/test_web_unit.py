"""The web page's parts without a browser: the memory samples table, the queries, the pure
figures and drawings, and the app over HTTP (token, methods, hosts)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.store import Store
from orchestrator.store.gpu_samples import GpuReading, gpu_sample_series, record_gpu_samples
from orchestrator.store.web_queries import AttemptSpan, attempt_spans, overview, sweep_counts
from orchestrator.web.charts import pack_lanes
from orchestrator.web.summary import occupancy

starlette = pytest.importorskip("starlette", reason="needs the web extra")


def reading(index: int = 0, used: int = 1000) -> GpuReading:
    return GpuReading(index, f"GPU-{index}", 24576, used, 24576 - used)


def span(attempt_id: int, gpu: int, start: float, end: float | None, outcome: str | None = "succeeded", config: str = "c") -> AttemptSpan:
    return AttemptSpan(attempt_id, attempt_id, 1, gpu, 1, None, outcome, start, end, "s", config, 1, "glue_rte", 2048, 1024)


def test_samples_are_spaced_and_bounded(db_path: Path) -> None:
    with Store(db_path) as store:
        assert record_gpu_samples(store, [reading(0), reading(1)], 100.0, every_s=2.0)
        assert not record_gpu_samples(store, [reading(0), reading(1)], 101.0, every_s=2.0)  # too soon
        for i in range(60):
            record_gpu_samples(store, [reading(0, used=i), reading(1)], 200.0 + i, every_s=0.0, max_rows_per_gpu=20)
        series = gpu_sample_series(store)
    gpu0 = [s for s in series if s.gpu_index == 0]
    assert 10 <= len(gpu0) <= 20
    assert gpu0[0].ts == 100.0  # the oldest survives thinning: the whole sweep stays drawn
    assert gpu0[-1].ts == 259.0 and gpu0[-1].used_mib == 59  # recent rows at full resolution
    assert [s.ts for s in gpu0] == sorted(s.ts for s in gpu0)


def test_ours_is_what_live_attempts_hold(db_path: Path) -> None:
    from benchmarks.web_load import build_sweep

    build_sweep(db_path, 40, running=3, queued=5)
    with Store(db_path) as store:
        held = {r["gpu_uuid"]: r["h"] for r in store.query(
            "SELECT gpu_uuid, sum(held_mib) AS h FROM attempts WHERE outcome IS NULL GROUP BY gpu_uuid")}
        record_gpu_samples(store, [GpuReading(g, f"GPU-{g:04d}", 24576, 20000, 4576) for g in range(7)], 1e10)
        latest = {s.gpu_uuid: s for s in gpu_sample_series(store, since_s=1e10)}
        view = overview(store)
        counts = sweep_counts(store)
        running_ids = {r["id"] for r in store.query("SELECT id FROM jobs WHERE state = 'running'")}
    assert held and all(latest[uuid].orch_mib == min(mib, 20000) for uuid, mib in held.items())
    assert {r.job_id for r in view.running} == running_ids and len(running_ids) == 3
    assert all(r.step == 20 and r.loss == 0.7 for r in view.running)
    assert view.waiting_total == 5 and all(w.reason for w in view.waiting)
    assert view.retries and all(e.retry["to_level"] == 1 for e in view.retries)  # the sweep's OOMs moved a level
    assert counts.jobs == 40 and counts.ooms == counts.oom_jobs_recovered > 0


def test_spans_filter_by_time_and_limit(db_path: Path) -> None:
    from benchmarks.web_load import build_sweep

    build_sweep(db_path, 120, running=2, queued=10)
    with Store(db_path) as store:
        every, total = attempt_spans(store)
        assert total == len(every) == store.query("SELECT count(*) AS n FROM attempts")[0]["n"]
        latest, total_again = attempt_spans(store, limit=7)
        assert total_again == total and [s.attempt_id for s in latest] == [s.attempt_id for s in every[-7:]]
        middle = every[len(every) // 2]
        window, _ = attempt_spans(store, from_s=middle.started_at, to_s=middle.started_at + 1)
    assert middle.attempt_id in {s.attempt_id for s in window}
    assert all(s.started_at <= middle.started_at + 1 and (s.ended_at is None or s.ended_at >= middle.started_at) for s in window)


def test_occupancy_counts_busy_gpu_time_once() -> None:
    spans = [span(1, 0, 0, 10), span(2, 0, 5, 15), span(3, 1, 0, 10), span(4, 1, 20, None, outcome=None)]
    occ = occupancy(spans, now_s=30)
    assert occ.gpu_hours == pytest.approx((15 + 10 + 10) / 3600)
    assert occ.attempt_hours == pytest.approx((10 + 10 + 10 + 10) / 3600)
    assert occ.packing_density == pytest.approx(40 / 35)
    assert occupancy([], now_s=1).packing_density is None


def test_timeline_draws_one_bar_per_attempt_in_lanes_without_overlap() -> None:
    spans = [span(1, 0, 0, 10), span(2, 0, 5, 15, outcome="oom"), span(3, 0, 12, 20), span(4, 1, 0, 5, config="<script>x")]
    rows = pack_lanes(spans, now_s=20)
    assert rows[1] == 0 and rows[2] == 1 and rows[3] == 0  # 3 starts after 1 ended: back on row 0
    from orchestrator.web.pages import timeline_fragment

    svg = timeline_fragment(spans, len(spans), 0, 20, 20, zoomed=False, gpus=[])
    assert svg.count('class="attempt"') == 4
    assert svg.count('class="oom-mark"') == 1
    assert "<script>" not in svg and "&lt;script&gt;" in svg


@pytest.fixture
def client(db_path: Path):  # type: ignore[no-untyped-def]
    from starlette.testclient import TestClient

    from benchmarks.web_load import build_sweep
    from orchestrator.web.app import create_app

    build_sweep(db_path, 30, running=2, queued=4)
    with TestClient(create_app(db_path, "t0ken"), base_url="http://127.0.0.1:8765") as test_client:
        yield test_client


def test_every_page_answers(client, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    for page in ("/", "/timeline", "/memory", "/job/3", "/results", "/fragment/overview", "/fragment/timeline",
                 "/fragment/memory", "/fragment/job/3", "/fragment/results"):
        response = client.get(page)
        assert response.status_code == 200, page
    with Store(db_path) as store:
        n_attempts = store.query("SELECT count(*) AS n FROM attempts")[0]["n"]
    assert client.get("/timeline").text.count('class="attempt"') == n_attempts
    csv = client.get("/results.csv")
    assert csv.headers["content-type"].startswith("text/csv")
    assert csv.text.splitlines()[0] == "suite,config,task,metric,mean,std,n_seeds,seeds,levels,mixed_levels"
    assert client.get("/job/9999").status_code == 404
    assert client.get("/job/99999999999999999999999").status_code == 404  # beyond SQLite's integers
    assert client.get("/timeline?from=abc").status_code == 400


@pytest.mark.parametrize("query", ["from=0&to=1e20", "to=-1e300", "from=1e19", "from=200&to=100", "from=nan"])
def test_a_time_range_no_clock_can_show_is_a_400(client, query: str) -> None:  # type: ignore[no-untyped-def]
    for page in ("/timeline", "/fragment/timeline"):
        response = client.get(f"{page}?{query}")
        assert response.status_code == 400, (page, query, response.text)
        assert "Traceback" not in response.text and response.text.count("\n") == 0
    assert client.get("/timeline?from=0&to=253402300799").status_code == 200


def test_actions_need_the_token_and_a_post(client, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    def state(job_id: int) -> str:
        with Store(db_path) as store:
            return str(store.query("SELECT state FROM jobs WHERE id = ?", [job_id])[0]["state"])

    queued = 30  # the last jobs of the synthetic sweep are queued
    assert client.post(f"/api/jobs/{queued}/cancel").status_code == 403
    assert client.post(f"/api/jobs/{queued}/cancel", headers={"X-Orch-Token": "wrong"}).status_code == 403
    assert client.get(f"/api/jobs/{queued}/cancel").status_code == 405
    assert state(queued) == "queued"
    done = client.post(f"/api/jobs/{queued}/cancel", headers={"X-Orch-Token": "t0ken"})
    assert done.status_code == 200 and done.json() == {"job": queued, "done": "cancelled"}
    assert state(queued) == "cancelled"
    again = client.post(f"/api/jobs/{queued}/retry", headers={"X-Orch-Token": "t0ken"})
    assert again.json()["done"] == "requeued" and state(queued) == "queued"
    assert client.post("/api/jobs/9999/cancel", headers={"X-Orch-Token": "t0ken"}).status_code == 404
    huge = "/api/jobs/99999999999999999999999/cancel"
    assert client.post(huge, headers={"X-Orch-Token": "t0ken"}).status_code == 404
    assert client.post("/api/suites/nope/resume", headers={"X-Orch-Token": "t0ken"}).status_code == 409


def test_loopback_server_refuses_other_host_names(client) -> None:  # type: ignore[no-untyped-def]
    # a page on another site that resolves its name to 127.0.0.1 (DNS rebinding) gets nothing
    assert client.get("/", headers={"Host": "attacker.example"}).status_code == 400
    assert client.get("/", headers={"Host": "localhost:8765"}).status_code == 200


def test_a_loopback_address_it_listens_on_is_a_good_host_name(db_path: Path) -> None:
    from starlette.testclient import TestClient

    from benchmarks.web_load import build_sweep
    from orchestrator.web.app import create_app

    build_sweep(db_path, 3, running=0, queued=1)
    with TestClient(create_app(db_path, "t", bound_host="127.0.0.2"), base_url="http://127.0.0.2:8765") as c:
        assert c.get("/").status_code == 200
        assert c.get("/", headers={"Host": "attacker.example"}).status_code == 400


def test_report_cli_writes_one_file(orch_inproc, db_path: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from benchmarks.web_load import build_sweep

    build_sweep(db_path, 25, running=0, queued=0)
    out = tmp_path / "sweep.html"
    result = orch_inproc("report", "--out", str(out))
    assert result.rc == 0, result.stderr
    html = out.read_text()
    assert 'data-summary="jobs">25<' in html and "<link" not in html and "src=" not in html
    assert "Content-Security-Policy\" content=\"default-src 'none';" in html and "connect-src" not in html
    bad = orch_inproc("report", "--out", str(tmp_path / "missing" / "x.html"))
    assert bad.rc == 2 and bad.stderr.count("\n") == 1 and "does not exist" in bad.stderr
    assert not (tmp_path / "missing").exists()


def test_web_refuses_a_busy_port_in_one_line(orch, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    import socket

    with Store(db_path):
        pass
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        result = orch("web", "--port", str(busy.getsockname()[1]))
    assert result.rc == 2 and result.stderr.startswith("orch: error: cannot listen on") and result.stderr.count("\n") == 1
    assert os.path.exists(db_path)


def test_web_warns_when_listening_beyond_this_machine(db_path: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    with Store(db_path):
        pass
    env = {**os.environ, "ORCH_DB": str(db_path), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "web", "--host", "0.0.0.0", "--port", "0"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None and proc.stdout is not None
        warning = proc.stderr.readline()
        first = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "warning: listening on 0.0.0.0" in warning
    assert first.startswith("orch web: serving") and ":0/" not in first  # the port it really got
