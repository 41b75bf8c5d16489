"""The web page's parts without a browser: the memory samples table, the queries, the pure
figures and drawings, and the app over HTTP (token, methods, hosts)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.lifecycle import JobState
from orchestrator.store import Store
from orchestrator.store.gpu_samples import GpuReading, gpu_sample_series, record_gpu_samples
from orchestrator.store.queries import get_attempts
from orchestrator.store.rows import Job
from orchestrator.store.sweep_attempts import attempt_counts
from orchestrator.store.web_queries import AttemptSpan, attempt_spans, overview, sweep_counts
from orchestrator.web.charts import pack_lanes
from orchestrator.web.summary import occupancy
from tests.store_reads import job_ids, live_attempts, read_jobs, state_of

starlette = pytest.importorskip("starlette", reason="needs the web extra")


def reading(index: int = 0, used: int = 1000) -> GpuReading:
    return GpuReading(index, f"GPU-{index}", 24576, used, 24576 - used)


def span(
    attempt_id: int,
    gpu: int,
    start: float,
    end: float | None,
    outcome: str | None = "succeeded",
    config: str = "c",
) -> AttemptSpan:
    return AttemptSpan(
        attempt_id,
        attempt_id,
        1,
        gpu,
        1,
        None,
        outcome,
        start,
        end,
        "s",
        config,
        1,
        "glue_rte",
        2048,
        1024,
    )


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
        held: dict[str, int] = {}
        for attempt in live_attempts(store):
            held[attempt.gpu_uuid] = held.get(attempt.gpu_uuid, 0) + attempt.held_mib
        record_gpu_samples(store, [GpuReading(g, f"GPU-{g:04d}", 24576, 20000, 4576) for g in range(7)], 1e10)
        latest = {s.gpu_uuid: s for s in gpu_sample_series(store, since_s=1e10)}
        view = overview(store)
        counts = sweep_counts(store)
        running_ids = set(job_ids(store, JobState.RUNNING))
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
        assert total == len(every) == attempt_counts(store).claimed
        latest, total_again = attempt_spans(store, limit=7)
        assert total_again == total and [s.attempt_id for s in latest] == [s.attempt_id for s in every[-7:]]
        middle = every[len(every) // 2]
        window, _ = attempt_spans(store, from_s=middle.started_at, to_s=middle.started_at + 1)
    assert middle.attempt_id in {s.attempt_id for s in window}
    assert all(
        s.started_at <= middle.started_at + 1
        and (s.ended_at is None or s.ended_at >= middle.started_at)
        for s in window
    )


def test_occupancy_counts_busy_gpu_time_once() -> None:
    spans = [span(1, 0, 0, 10), span(2, 0, 5, 15), span(3, 1, 0, 10), span(4, 1, 20, None, outcome=None)]
    occ = occupancy(spans, now_s=30)
    assert occ.gpu_hours == pytest.approx((15 + 10 + 10) / 3600)
    assert occ.attempt_hours == pytest.approx((10 + 10 + 10 + 10) / 3600)
    assert occ.packing_density == pytest.approx(40 / 35)
    assert occupancy([], now_s=1).packing_density is None


def test_timeline_draws_one_bar_per_attempt_in_lanes_without_overlap() -> None:
    spans = [
        span(1, 0, 0, 10),
        span(2, 0, 5, 15, outcome="oom"),
        span(3, 0, 12, 20),
        span(4, 1, 0, 5, config="<script>x"),
    ]
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
        n_attempts = attempt_counts(store).claimed
    assert client.get("/timeline").text.count('class="attempt"') == n_attempts
    csv = client.get("/results.csv")
    assert csv.headers["content-type"].startswith("text/csv")
    assert csv.text.splitlines()[0] == (
        "suite,config,task,metric,mean,std,n_seeds,seeds,levels,mixed_levels,"
        "overrides,test_is_val,dropout_differs,notes,val_mean,val_std,val_n,"
        "best_steps,submitted,failed,cancelled,running,queued,no_metric,accounted,"
        "pooled,chosen_by,inexact_rungs,run_levels,run_inexact_rungs,diverged,mixed_provenance,pruned,fused_runs"
    )
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
            return state_of(store, job_id)

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


def test_web_refuses_a_busy_port_in_one_line(orch_cli, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    import socket

    with Store(db_path):
        pass
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        result = orch_cli("web", "--port", str(busy.getsockname()[1]))
    assert (
        result.rc == 2
        and result.stderr.startswith("orch: error: cannot listen on")
        and result.stderr.count("\n") == 1
    )
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


def _set_state(db_path: Path, job_id: int, state: str, **columns: object) -> None:
    with Store(db_path) as store, store.write():
        sets = ", ".join(["state = ?", *(f"{k} = ?" for k in columns)])
        store.execute(f"UPDATE jobs SET {sets} WHERE id = ?", [state, *columns.values(), job_id])


def test_jobs_page_filters_by_state_suite_config_and_data(  # type: ignore[no-untyped-def]
    client, db_path: Path
) -> None:
    import re

    def listed(query: str) -> set[int]:
        response = client.get(f"/fragment/jobs?{query}")
        assert response.status_code == 200, response.text
        return {int(j) for j in re.findall(r'<tr class="job-row" data-job="(\d+)"', response.text)}

    with Store(db_path) as store:
        every = read_jobs(store)

        def ids(matches: Callable[[Job], bool] = lambda job: True) -> set[int]:
            return {job.id for job in every if matches(job)}

        assert listed("") == ids()
        assert listed("state=queued") == ids(lambda j: j.state == JobState.QUEUED) and len(listed("state=queued")) == 4
        assert listed("config=c03") == ids(lambda j: j.config_name == "c03")
        assert listed("data=glue-tvt_rte&state=succeeded") == ids(
            lambda j: j.data == "glue-tvt_rte" and j.state == JobState.SUCCEEDED)
        assert listed("suite=E1") == ids() and listed("suite=nope") == set()
    page = client.get("/jobs?state=failed")
    assert page.status_code == 200 and "no job matches" in page.text
    assert 'data-fragment="/fragment/jobs?state=failed"' in page.text
    assert client.get("/jobs?state=exploded").status_code == 400
    assert client.get("/jobs?config=" + "x" * 300).status_code == 400
    overview_page = client.get("/").text
    assert 'href="/jobs?state=succeeded"' in overview_page and 'href="/jobs?state=queued"' in overview_page


def test_a_failed_job_is_one_click_from_the_overview(client, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    _set_state(db_path, 5, "failed", reason="exit code 2: python: can't open file 'trian.py'")
    overview_page = client.get("/").text
    assert 'href="/jobs?state=failed"' in overview_page and "1 failed" in overview_page
    failed = client.get("/jobs?state=failed").text
    assert 'data-job="5"' in failed and "trian.py" in failed and failed.count('class="job-row"') == 1


def test_pages_escape_what_users_and_workers_wrote(client, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    with Store(db_path) as store, store.write():
        store.execute("UPDATE jobs SET config_name = '<script>alert(1)</script>', "
                      "overrides_json = '{\"x\": \"<img src=x onerror=alert(1)>\"}' WHERE id = 3")
        run_dir = get_attempts(store, 3)[0].run_dir
    (Path(run_dir) / "progress.jsonl").write_text('{"step": 1, "</script><script>alert(1)</script>": 1.0}\n')
    for page in ("/jobs", "/job/3", "/timeline", "/results", "/curves?job=3"):
        text = client.get(page).text
        assert "<script>alert" not in text and "<img src=x" not in text, page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in client.get("/jobs").text
    assert "\\u003c/script\\u003e" in client.get("/job/3").text  # in the chart's JSON, it cannot close the element


def test_job_page_offers_only_what_its_state_allows(client, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    import re

    from orchestrator.lifecycle import JobState
    from orchestrator.web.pages import ACTIONS_BY_STATE

    def buttons(job_id: int) -> list[str]:
        return re.findall(r'action="/api/jobs/\d+/(\w+)"', client.get(f"/fragment/job/{job_id}").text)

    assert buttons(27) == ["cancel"]  # queued
    assert buttons(25) == ["cancel", "retry"]  # running
    assert buttons(1) == []  # succeeded
    _set_state(db_path, 2, "failed")
    assert buttons(2) == ["retry"]
    # and the actions agree: what a state does not offer changes nothing (refused, or skipped)
    for job_id, state in ((1, JobState.SUCCEEDED), (27, JobState.QUEUED)):
        for name in ("cancel", "retry"):
            response = client.post(f"/api/jobs/{job_id}/{name}", headers={"X-Orch-Token": "t0ken"})
            acted = response.status_code == 200 and response.json()["done"] != "skipped"
            assert acted == (name in ACTIONS_BY_STATE[state]), (job_id, name, response.text)
            if acted:
                break  # the job's state moved on


def test_job_page_shows_final_metrics_and_set_overrides(client, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    with Store(db_path) as store, store.write():
        store.execute("UPDATE jobs SET overrides_json = '{\"learning_rate\": 0.001}' WHERE id = 1")
    page = client.get("/job/1").text
    assert "<code>learning_rate=0.001</code>" in page
    assert 'href="/curves?config=c01&amp;job=1&amp;band=1"' in page  # its config's seeds, one click away
    assert re.search(r"<b>accuracy</b> 0\.\d+", page) and "<b>f1</b> 0.7" in page
    queued = client.get("/job/27").text
    assert "none: the config as written" in queued and "only a succeeded attempt has final metrics" in queued
    oomed = client.get("/job/10").text  # an OOM'd attempt, then a succeeded one: a line each in the curves
    spec = json.loads(re.search(r'<script type="application/json">(.*?)</script>', oomed, re.S).group(1))
    assert [r["label"].split(" · ")[0] for r in spec["runs"]] == ["attempt 1", "attempt 2"]
    assert spec["runs"][0]["colour"] != spec["runs"][1]["colour"] and spec["metrics"] == ["loss"]


def test_job_page_names_a_non_finite_test_metric_as_results_notes_do() -> None:
    # pure: a result.json whose only test metric is NaN reported one, not counted, not "no metrics"
    from orchestrator.results.aggregate import ResultRow, aggregate
    from orchestrator.results.collect import job_metrics
    from orchestrator.web.views import reported_metrics

    nan_only = job_metrics({"metrics": {"test": {"accuracy": float("nan")}}}, None, aliases=False)
    said = "reported a non-finite test accuracy (nan): not counted"
    assert reported_metrics(nan_only) == (None, f"the succeeded attempt {said}")
    (summary,) = aggregate([ResultRow("E", "c", "t", 1, {}, job=3, nonfinite={"accuracy": "nan"})])
    assert f"seed 1 (job 3) {said}" in summary.notes  # the sentence `orch results` notes hold
    both = reported_metrics({"accuracy": float("inf"), "f1": -float("inf")})[1]
    assert both == "the succeeded attempt reported a non-finite test accuracy (inf), a non-finite test f1 (-inf): " \
                   "not counted"
    assert reported_metrics({"accuracy": 0.5, "f1": float("nan")}) == ({"accuracy": 0.5}, "")
    assert reported_metrics({"accuracy": 1e305}) == (  # beyond 1e300: named as a NaN is
        None, "the succeeded attempt reported a test accuracy too large to average (1e+305): not counted")
    for nothing in (None, {}, {"text": "NaN"}):
        assert reported_metrics(nothing)[1].startswith("the succeeded attempt reported no metrics (")


def test_every_page_shows_a_bidirectional_override_escaped_in_text_and_chart_data() -> None:
    # pure: what a template prints and what a chart's script is given, by the one rule of the CLI
    from markupsafe import Markup

    from orchestrator.results.trials import TrialRow
    from orchestrator.web.templating import environment, json_script
    from orchestrator.web.trials_plot import key_plots

    page = environment().from_string("<td>{{ name }}</td><pre>{{ log }}</pre>{{ made }}").render(
        name="acc\u202eycarucca", log="line 1\n\tline\u2066 2", made=Markup("<b>ours</b>"))
    assert page == "<td>acc\\u202eycarucca</td><pre>line 1\n\tline\\u2066 2</pre><b>ours</b>"
    data = json_script({"metrics": ["val\u202eloss"], "curves": {"val\u202eloss": [[1, 2], [0.5, 0.25]]}})
    assert json.loads(data) == {"metrics": ["val\\u202eloss"], "curves": {"val\\u202eloss": [[1, 2], [0.5, 0.25]]}}
    (plot,) = key_plots([TrialRow(0, {"lr": 0.1}, 0.5, 1, 1, {"succeeded": 1})], ["lr"], set(), "acc\u202e")
    assert "\u202e" not in plot.svg and "acc\\u202e" in plot.svg


def test_a_value_the_page_sends_back_is_the_stored_name_while_its_label_reads_escaped() -> None:
    # a filter option, the curves page's hidden metric and the chart's metric names go back to the
    # server (or into the address): they must name what is stored, not its escaped reading
    import html
    import re

    from orchestrator.store.web_queries import JobsFilter, JobsPage
    from orchestrator.web import pages
    from orchestrator.web.curves import Curve, Run, chart_spec

    name = "lr\u202esched"
    jobs = pages.jobs_fragment(JobsPage([], 0, [name], [name], [name]), JobsFilter(config=name), {})
    offered = [html.unescape(v) for v in re.findall(r'<option value="([^"]+)"', jobs)]
    assert offered.count(name) == 3 and "selected>lr\\u202esched</option>" in jobs
    spec = chart_spec([Run("job-1", "job 1", "g", {name: Curve([1.0], [0.5])})], key="curves", metric=name)
    page = pages.curves_fragment([{}], spec, [name], name, [1], 0, keys=["config", name], by=name)
    sent_back = [html.unescape(v) for v in re.findall(r'value="([^"]*)"', page)]
    assert sent_back.count(name) == 3  # the config option, the colour-by option, the hidden metric
    assert page.count(">lr\\u202esched</option>") == 2  # what a person reads: escaped
    data = json.loads(html.unescape(page.split('<script type="application/json">')[1].split("</script>")[0]))
    assert data["metric"] == name and data["metrics"] == [name] and list(data["runs"][0]["curves"]) == [name]
    assert data["labels"] == {name: "lr\\u202esched"} and list(data["bands"]) == [name]


def test_the_job_page_log_tail_leaves_terminal_sequences_out_colours_too(tmp_path: Path) -> None:
    # the page shows text: a colour code would read `\x1b[32m`, a title write would be noise
    from orchestrator.web.views import job_log_tail
    from tests.run_dirs import private_attempt_dir

    run_dir = private_attempt_dir(tmp_path)
    (run_dir / "stdout.log").write_text("\x1b[32mok\x1b[0m\tstep 1\n\x1b]0;title\x07bar 10%\rbar 100%\ndone\x1b[2K\n")
    assert job_log_tail(str(run_dir)) == "ok\tstep 1\nbar 100%\ndone\n"


def test_a_form_post_is_answered_with_a_page_and_the_api_with_json(  # type: ignore[no-untyped-def]
    client, db_path: Path
) -> None:
    form = {"content-type": "application/x-www-form-urlencoded"}
    refused = client.post("/api/jobs/28/cancel", content="token=wrong", headers=form)
    assert refused.status_code == 403 and refused.headers["content-type"].startswith("text/html")
    assert "Refused (403)" in refused.text and "wrong" not in refused.text
    done = client.post("/api/jobs/28/cancel", content="token=t0ken", headers=form)
    assert done.status_code == 200 and "job 28 is cancelled" in done.text and 'href="/job/28"' in done.text
    again = client.post("/api/jobs/28/cancel", content="token=t0ken", headers=form)
    assert again.status_code == 200 and "job 28: nothing to do" in again.text
    not_done = client.post("/api/jobs/1/retry", content="token=t0ken", headers=form)  # succeeded: refused
    assert not_done.status_code == 409 and "Not done (409)" in not_done.text and "succeeded" in not_done.text
    too_big = client.post("/api/jobs/29/cancel", content="token=t0ken&pad=" + "x" * 5000, headers=form)
    assert too_big.status_code == 403
    api = client.post("/api/jobs/29/cancel", headers={"X-Orch-Token": "t0ken"})
    assert api.json() == {"job": 29, "done": "cancelled"}
    # a form post carries the token in its body only: a header alone does not make it an API call
    mixed = client.post("/api/jobs/30/cancel", content="token=", headers={**form, "X-Orch-Token": "t0ken"})
    assert mixed.status_code == 403


def test_static_files_are_served_and_live_pages_load_only_from_their_server(  # type: ignore[no-untyped-def]
    client
) -> None:
    from orchestrator.web.assets import UPLOT_VERSION

    uplot = client.get("/static/uPlot.iife.min.js")
    assert uplot.status_code == 200 and uplot.headers["content-type"].startswith("text/javascript")
    assert "uPlot" in uplot.text and UPLOT_VERSION == "1.6.32"
    assert client.get("/static/orch.css").headers["content-type"].startswith("text/css")
    assert client.get("/static/uPlot.LICENSE").status_code == 404  # only the files the page uses
    assert client.get("/static/..%2Fapp.py").status_code == 404
    page = client.get("/memory").text
    assert "script-src 'self';" in page and "https://" not in page and 'src="/static/uPlot.iife.min.js"' in page


def test_memory_samples_record_each_jobs_share(db_path: Path) -> None:
    from benchmarks.web_load import build_sweep

    build_sweep(db_path, 10, running=3, queued=0)
    with Store(db_path) as store:
        record_gpu_samples(store, [GpuReading(g, f"GPU-{g:04d}", 24576, 20000, 4576) for g in range(7)], 1e10)
        held = live_attempts(store)
        latest = {s.gpu_index: s for s in gpu_sample_series(store, since_s=1e10)}
    assert held
    for attempt in held:
        assert latest[attempt.gpu_index].held_by_job[attempt.job_id] == attempt.held_mib
    assert all(sum(s.held_by_job.values()) == s.orch_mib for s in latest.values())


def test_curves_page_overlays_picked_jobs_and_a_configs_seeds(client) -> None:  # type: ignore[no-untyped-def]
    import re

    def spec(query: str) -> dict:  # type: ignore[type-arg]
        text = client.get(f"/curves?{query}").text
        return json.loads(re.search(r'<script type="application/json">(.*?)</script>', text, re.S).group(1))

    picked = spec("job=1&job=2&log=1&smooth=0.5")
    assert [r["key"] for r in picked["runs"]] == ["job-1", "job-2"] and picked["log"] and picked["smooth"] == 0.5
    by_config = spec("config=c01")
    assert len(by_config["runs"]) >= 1 and all("/c01" in r["group"] for r in by_config["runs"])
    assert client.get("/curves?job=abc").status_code == 400
    for bad in ("1.5", "nan", "x", "-0.1"):
        response = client.get(f"/curves?smooth={bad}")
        assert response.status_code == 400 and response.text.startswith("smooth must be a number from 0 to 0.99")
    assert "no run picked yet" in client.get("/curves").text
    assert "1 picked job(s) have no attempt yet" in client.get("/curves?job=30&job=1").text


def test_web_results_agree_with_orch_results(client, orch_inproc) -> None:  # type: ignore[no-untyped-def]
    cli = orch_inproc("results", "--csv")
    assert cli.rc == 0, cli.stderr
    web = client.get("/results.csv").text
    assert web == cli.stdout and ",1,false" in web  # an OOM'd job's seed ran at level 1, and the page says so
    page = client.get("/results").text
    assert 'class="pivot-row"' in page and '<td class="levels">1</td>' in page
