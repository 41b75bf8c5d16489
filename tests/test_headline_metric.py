"""The job lists (`orch jobs`, the web page's jobs, `Sweep.jobs()`) show the metric `orch results`
shows for the job's task: the tutorial's script prints accuracy and eval_loss, and both say
accuracy."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.api.jobs import shown_metric
from orchestrator.results.aggregate import ResultRow, choose_metric
from orchestrator.results.collect import job_metrics, val_metrics
from orchestrator.results.headline import headline_metric

CASES = [
    ("toy", {"accuracy": 0.93, "eval_loss": 0.4, "loss": 0.4}, "accuracy"),  # the tutorial's script
    ("glue-tvt_mrpc", {"eval_accuracy": 0.8, "eval_f1": 0.85, "loss": 0.3}, "eval_f1"),
    ("glue-tvt_rte", {"test_accuracy": 0.7, "val_accuracy": 0.72, "loss": 0.3}, "test_accuracy"),
    (
        "glue-tvt_cola",
        {"eval_accuracy": 0.8, "loss": 0.3},
        "eval_accuracy",
    ),  # no mcc: accuracy, as results
]


@pytest.mark.parametrize(("task", "values", "expected"), CASES)
def test_the_headline_is_the_metric_results_show(
    task: str, values: dict[str, float], expected: str
) -> None:
    key, value = headline_metric(values, task) or ("", 0.0)
    assert key == expected and value == values[expected]
    # results read eval_X as the validation split's X: the task's metric in either split
    reported = {**val_metrics(None, dict(values)), **(job_metrics(None, dict(values)) or {})}
    row = ResultRow("E1", "c", task, 1, reported)
    shown_by_results, _ = choose_metric(task, [row])
    assert key.removeprefix("test_").removeprefix("eval_") == shown_by_results


def test_a_script_without_accuracy_keeps_the_eval_metric_then_the_loss() -> None:
    assert headline_metric({"eval_bleu": 30.0, "eval_loss": 1.0, "loss": 1.2}, "toy") == (
        "eval_bleu",
        30.0,
    )
    assert headline_metric({"loss": 1.2, "learning_rate": 1e-4}, "toy") == ("loss", 1.2)
    assert headline_metric({"learning_rate": 1e-4}, "toy") is None
    assert shown_metric({"accuracy": 0.93125, "eval_loss": 0.4}, "toy") == "accuracy=0.9313"


def test_a_value_an_earlier_attempt_reported_says_whose_it_is() -> None:
    """Right after a retry, attempt 2 has reported nothing: attempt 1's loss is not attempt 2's."""
    from orchestrator.cli.jobs.table import jobs_extras
    from orchestrator.store.job_facts import JobFacts

    facts = {1: JobFacts(1, 15.0, 1, {"loss": 0.0596}), 2: JobFacts(2, 3.0, 2, {"loss": 0.5}), 3: JobFacts(3)}
    extras = jobs_extras(facts, {}, {1: 2, 2: 2, 3: 1})
    assert extras[1][0] == "loss=0.0596@att1" and extras[2][0] == "loss=0.5" and extras[3][0] == "-"



def test_the_web_jobs_page_says_when_a_value_is_an_earlier_attempts(tmp_path: Path) -> None:
    pytest.importorskip("starlette", reason="needs the web extra")
    from starlette.testclient import TestClient

    from benchmarks.web_load import build_sweep
    from orchestrator.store import Store
    from orchestrator.web.app import create_app

    db_path = tmp_path / "state.db"
    build_sweep(db_path, 10, running=0, queued=0)  # job 10 ran twice (its first attempt OOM'd)
    with Store(db_path) as store, store.write():
        first = store.query("SELECT min(id) AS id FROM attempts WHERE job_id = 10")[0]["id"]
        store.execute("INSERT INTO metric_history (attempt_id, key, step, value) VALUES (?, 'loss', 5, 0.0596)",
                      [first])
        assert store.query("SELECT count(*) AS n FROM attempts WHERE job_id = 10")[0]["n"] == 2
    with TestClient(create_app(db_path, "t0ken"), base_url="http://127.0.0.1:8765") as client:
        page = client.get("/jobs").text
    assert '<span class="muted">loss</span> 0.0596 <span class="muted" title="reported by attempt 1' in page
