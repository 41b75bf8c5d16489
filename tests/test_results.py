from __future__ import annotations

import csv
import io
import math

import pytest

from orchestrator.results import ResultRow, aggregate, primary_metric
from orchestrator.results_format import render_rows, to_csv


def test_primary_metric_follows_glue_convention() -> None:
    assert primary_metric("glue-tvt_cola") == "mcc"
    assert primary_metric("glue_mrpc") == "f1"
    assert primary_metric("glue-tvt_qqp_1000") == "f1"
    assert primary_metric("glue-tvt_qnli") == "accuracy"
    assert primary_metric("glue_rte_200") == "accuracy"


def test_mean_and_sample_std_over_seeds() -> None:
    rows = [
        ResultRow("E1", "r8", "glue-tvt_rte", 87, {"accuracy": 0.60}),
        ResultRow("E1", "r8", "glue-tvt_rte", 127, {"accuracy": 0.70}),
        ResultRow("E1", "r8", "glue-tvt_rte", 3, {"accuracy": 0.80}),
        ResultRow("E1", "r8", "glue_mrpc", 87, {"accuracy": 0.9, "f1": 0.5}),
    ]
    by_task = {s.task: s for s in aggregate(rows)}
    rte = by_task["glue-tvt_rte"]
    assert rte.metric == "accuracy"
    assert rte.mean == pytest.approx(0.70)
    assert rte.std == pytest.approx(0.10)  # sqrt((0.01 + 0 + 0.01) / 2)
    assert (rte.n_seeds, rte.seeds) == (3, (3, 87, 127))
    mrpc = by_task["glue_mrpc"]
    assert (mrpc.metric, mrpc.mean, mrpc.std, mrpc.n_seeds) == ("f1", 0.5, 0.0, 1)


def test_groups_are_separate_and_sorted_and_retried_seed_counts_once() -> None:
    rows = [
        ResultRow("E2", "a", "glue_rte", 1, {"accuracy": 0.5}),
        ResultRow("E1", "b", "glue_rte", 1, {"accuracy": 0.2}),
        ResultRow("E1", "a", "glue_rte", 1, {"accuracy": 0.1}),
        ResultRow("E1", "a", "glue_rte", 1, {"accuracy": 0.3}),  # same seed again: last wins
    ]
    summaries = aggregate(rows)
    assert [(s.suite, s.config) for s in summaries] == [("E1", "a"), ("E1", "b"), ("E2", "a")]
    assert summaries[0].mean == pytest.approx(0.3)
    assert summaries[0].n_seeds == 1


def test_missing_metric_gives_no_mean() -> None:
    (summary,) = aggregate([ResultRow("E1", "a", "glue_cola", 1, {"accuracy": 0.7})])
    assert summary.metric == "mcc"
    assert summary.mean is None
    assert summary.n_seeds == 0
    assert render_rows([summary])[0][4] == "—"


def test_csv_and_rendered_rows() -> None:
    summaries = aggregate(
        [
            ResultRow("E1", "r8", "glue_rte", 1, {"accuracy": 0.5}),
            ResultRow("E1", "r8", "glue_rte", 2, {"accuracy": 1.0}),
        ]
    )
    parsed = list(csv.DictReader(io.StringIO(to_csv(summaries))))
    assert len(parsed) == 1
    assert parsed[0]["metric"] == "accuracy"
    assert float(parsed[0]["mean"]) == pytest.approx(0.75)
    assert float(parsed[0]["std"]) == pytest.approx(math.sqrt(0.125))
    assert parsed[0]["seeds"] == "1 2"
    assert render_rows(summaries, digits=2) == [
        ["E1", "r8", "glue_rte", "accuracy", "0.75 ± 0.35", "2", "1 2"]
    ]


def test_own_task_without_accuracy_shows_its_first_metric() -> None:
    rows = [ResultRow("own", "a", "toy", 1, {"eval_loss": 0.5, "epoch": 1.0}),
            ResultRow("own", "a", "toy", 2, {"eval_loss": 0.7, "epoch": 1.0})]
    (summary,) = aggregate(rows)
    assert (summary.metric, summary.mean, summary.n_seeds) == ("eval_loss", pytest.approx(0.6), 2)


def test_job_metrics_sources() -> None:
    from orchestrator.results_source import job_metrics

    assert job_metrics({"metrics": {"test": {"accuracy": 0.7}}}, None) == {"accuracy": 0.7}
    assert job_metrics({"status": "succeeded", "metrics": {"eval_accuracy": 0.6}}, None) == {
        "eval_accuracy": 0.6, "accuracy": 0.6}
    assert job_metrics(None, '{"eval_accuracy": 0.81, "eval_loss": 0.4}') == {
        "eval_accuracy": 0.81, "eval_loss": 0.4, "accuracy": 0.81, "loss": 0.4}
    assert job_metrics({"metrics": {}}, '{"test_f1": 0.5}') == {"test_f1": 0.5, "f1": 0.5}
    assert job_metrics(None, None) is None and job_metrics(None, "not json") is None


def test_only_finite_metrics_are_kept() -> None:
    # result.json is written by user code: NaN, infinities and ints beyond a float are dropped
    # (float(10**400) raises; NaN would print as invalid JSON and poison a mean)
    from orchestrator.results_source import finite_metrics

    kept = finite_metrics({"nan": float("nan"), "inf": float("inf"), "huge": 10**400, "flag": True,
                           "text": "0.5", "acc": 0.8, "n": 3})
    assert kept == {"acc": 0.8, "n": 3.0}
