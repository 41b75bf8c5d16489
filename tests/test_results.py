from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pytest

from orchestrator.results.aggregate import ResultRow, aggregate, primary_metric
from orchestrator.results.formats import render_rows, to_csv


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
    assert (mrpc.metric, mrpc.mean, mrpc.std, mrpc.n_seeds) == ("f1", 0.5, None, 1)  # no std of one value


def test_groups_are_separate_and_sorted_and_a_seed_counts_once_unless_pooled() -> None:
    rows = [
        ResultRow("E2", "a", "glue_rte", 1, {"accuracy": 0.5}),
        ResultRow("E1", "b", "glue_rte", 1, {"accuracy": 0.2}),
        ResultRow("E1", "a", "glue_rte", 1, {"accuracy": 0.1}, job=1),
        ResultRow("E1", "a", "glue_rte", 1, {"accuracy": 0.3}, job=4),  # the same seed again (--force)
    ]
    summaries = aggregate(rows)
    assert [(s.suite, s.config) for s in summaries] == [("E1", "a"), ("E1", "b"), ("E2", "a")]
    # one value per seed: the latest succeeded run (a rerun is no second replicate)
    assert (summaries[0].mean, summaries[0].n, summaries[0].seeds) == (pytest.approx(0.3), 1, (1,))
    assert [r.job for r in summaries[0].runs] == [4]
    assert summaries[0].notes == ("seed 1 ran twice (jobs 1, 4): the latest, job 4, counted",)
    assert summaries[0].pooled is False and summaries[0].n_text == "1"
    pooled = aggregate(rows, pooled=True)
    assert (pooled[0].mean, pooled[0].n, pooled[0].seeds) == (pytest.approx(0.2), 2, (1, 1))
    assert pooled[0].notes == ("seed 1 ran twice (jobs 1, 4): every run counted (pooled)",)
    assert render_rows(pooled[:1])[0][8] == "1×2"


def test_a_row_without_its_task_metric_falls_back_and_says_which() -> None:
    # a worker that wrote only accuracy for CoLA and MRPC: never `mcc — 0`
    summaries = aggregate([ResultRow("E1", "a", "glue_cola", 1, {"accuracy": 0.7}),
                           ResultRow("E1", "a", "glue_cola", 2, {"accuracy": 0.9}),
                           ResultRow("E1", "a", "glue_mrpc", 1, {"accuracy": 0.8})])
    cola, mrpc = summaries
    assert (cola.metric, cola.primary, cola.mean, cola.n) == ("accuracy", "mcc", pytest.approx(0.8), 2)
    assert cola.notes == ("no run reported mcc: accuracy shown",)
    assert (mrpc.metric, mrpc.n, mrpc.notes) == ("accuracy", 1, ("no run reported f1: accuracy shown",))
    assert "no run reported f1: accuracy shown" in render_rows([mrpc])[0][10]


def test_a_split_prefixed_metric_asked_for_points_at_the_bare_name() -> None:
    """`--metric val_loss`: the table holds test metrics, each split under the bare name."""
    rows = [ResultRow("E1", "a", "glue_rte", seed, {"accuracy": 0.7, "loss": 0.6}) for seed in (1, 2)]
    (asked,) = aggregate(rows, metric="val_loss")
    assert asked.n == 0 and any(
        "no run reported val_loss among its test metrics: the table shows each split under the metric's bare name, "
        "--metric loss (val beside test)" in note for note in asked.notes
    ), asked.notes
    (bare,) = aggregate(rows, metric="loss")
    assert bare.n == 2 and not any("bare name" in note for note in bare.notes)


def test_runs_that_lack_the_shown_metric_are_named_not_dropped_silently() -> None:
    (summary,) = aggregate([ResultRow("E1", "a", "glue_mrpc", 1, {"f1": 0.7, "accuracy": 0.8}, job=1),
                            ResultRow("E1", "a", "glue_mrpc", 2, {"accuracy": 0.9}, job=2),
                            ResultRow("E1", "a", "glue_mrpc", 3, {}, job=3,
                                      no_metrics="no test metrics (result.json or printed)")])
    assert (summary.metric, summary.n, summary.mean) == ("f1", 1, 0.7)
    assert [r.job for r in summary.uncounted] == [2, 3]
    assert summary.notes == ("seed 2 (job 2) reported no f1: not counted",
                             "seed 3 (job 3) reported no test metrics (result.json or printed): not counted")


def test_an_empty_row_says_why() -> None:
    (summary,) = aggregate([ResultRow("E1", "a", "glue_cola", 1, {}, job=7)])  # only NaN metrics
    assert (summary.metric, summary.mean, summary.n) == ("mcc", None, 0)
    assert summary.notes == ("seed 1 (job 7) reported no finite metric: not counted",)
    assert render_rows([summary])[0][5] == "— ¶"  # a seed that reported nothing: mean over none


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
        ["E1", "r8", "-", "glue_rte", "accuracy", "0.75 ± 0.35", "", "2", "1 2", "", ""]
    ]


def test_own_task_without_accuracy_shows_its_first_metric() -> None:
    rows = [ResultRow("own", "a", "toy", 1, {"eval_loss": 0.5, "epoch": 1.0}),
            ResultRow("own", "a", "toy", 2, {"eval_loss": 0.7, "epoch": 1.0})]
    (summary,) = aggregate(rows)
    assert (summary.metric, summary.mean, summary.n_seeds) == ("eval_loss", pytest.approx(0.6), 2)


def test_job_metrics_sources() -> None:
    from orchestrator.results.collect import job_metrics

    assert job_metrics({"metrics": {"test": {"accuracy": 0.7}}}, None) == {"accuracy": 0.7}
    from orchestrator.results.collect import val_metrics

    # eval_* is the validation split, test_* the test split: each metric once, on its split
    assert job_metrics({"status": "succeeded", "metrics": {"eval_accuracy": 0.6}}, None) is None
    assert val_metrics({"status": "succeeded", "metrics": {"eval_accuracy": 0.6}}) == {"accuracy": 0.6}
    printed = '{"eval_accuracy": 0.81, "eval_loss": 0.4, "test_accuracy": 0.79}'
    assert job_metrics(None, printed) == {"accuracy": 0.79}
    assert val_metrics(None, printed) == {"accuracy": 0.81, "loss": 0.4}
    assert job_metrics({"metrics": {}}, '{"test_f1": 0.5}') == {"f1": 0.5}
    assert job_metrics(None, None) is None and job_metrics(None, "not json") is None


def test_only_finite_metrics_are_kept() -> None:
    # result.json is written by user code: NaN, infinities and ints beyond a float are dropped
    # (float(10**400) raises; NaN would print as invalid JSON and poison a mean)
    from orchestrator.results.collect import finite_metrics

    kept = finite_metrics({"nan": float("nan"), "inf": float("inf"), "huge": 10**400, "flag": True,
                           "text": "0.5", "acc": 0.8, "n": 3})
    assert kept == {"acc": 0.8, "n": 3.0}


def test_settings_that_differ_are_never_pooled() -> None:
    from orchestrator.results.aggregate import overrides_label, setting_digest

    base = {"learning_rate": 3e-4, "batch_size": 4}
    lr = {**base, "learning_rate": 1e-3}
    rows = [ResultRow("E1", "a", "glue_rte", s, {"accuracy": 0.5}, overrides={}, setting=setting_digest(base, {}))
            for s in (1, 2, 3)]
    rows += [ResultRow("E1", "a", "glue_rte", s, {"accuracy": 0.7}, overrides={"learning_rate": 1e-3},
                       setting=setting_digest(lr, {"learning_rate": 1e-3})) for s in (1, 2)]
    edited = {**base, "num_epochs": 3}  # the config file changed between two submits, no --set
    rows.append(ResultRow("E1", "a", "glue_rte", 4, {"accuracy": 0.9}, setting=setting_digest(edited, {})))
    summaries = aggregate(rows)
    assert [(s.label, s.n) for s in summaries if not s.variant] == [("a [learning_rate=0.001]", 2)]
    variants = sorted((s.n, s.variant) for s in summaries if s.variant)
    assert [n for n, _ in variants] == [1, 3] and all(v.startswith("setting ") for _, v in variants)
    assert setting_digest({**base, "seed": 1, "data": "x"}, {}) == setting_digest({**base, "seed": 2}, {})
    assert overrides_label({"b": 1e-3, "a": True, "c": 0.1 + 0.2}) == "a=true, b=0.001, c=0.30000000000000004"


def test_a_non_finite_test_metric_is_named_and_the_runs_finite_val_still_counts(tmp_path: Path) -> None:
    # Python's json.dump writes a metric gone NaN as a bare NaN: the file must still be read (its
    # val and other fields kept), the NaN named, never averaged; junk beside it changes nothing
    import json

    from orchestrator.attempts.reported import reading_from_record, reading_of
    from orchestrator.attempts.rundir_reads import read_result
    from orchestrator.results.run_lines import run_lines
    from tests.run_dirs import private_attempt_dir

    run_dir = private_attempt_dir(tmp_path)
    (run_dir / "result.json").write_text(
        '{"status": "succeeded", "best_step": 40, "peak_mem_mib": NaN, "metrics": {"test": {"accuracy": NaN,'
        ' "f1": 1e999, "huge": ' + "9" * 400 + ', "text": "NaN", "junk": [NaN, {"a": null}],'
        ' "deep": {"a": {"b": {"c": {"d": {"e": -Infinity}}}}}}, "val": {"accuracy": 0.8, "loss": -Infinity}}}')
    problems: list[str] = []
    result = read_result(run_dir, problems)
    assert result is not None and result["status"] == "succeeded" and result["best_step"] == 40
    assert problems == ["result.json: peak_mem_mib must be a number of MiB from 0 to 1073741824 or null, not nan"]
    reading = reading_of(result, None)
    assert (reading.metrics, reading.val_metrics) == ({}, {"accuracy": 0.8})
    assert (reading.nonfinite_test, reading.nonfinite_val) == (
        {"accuracy": "nan", "f1": "inf", "huge": "too large"}, {"loss": "-inf"})
    stored = reading_from_record(json.dumps(reading.to_record(), allow_nan=False))
    assert stored == reading

    def row(seed: int, job: int, test: dict, val: dict, nonfinite: dict | None = None) -> ResultRow:
        return ResultRow("E1", "r8", "glue_rte", seed, test, job=job, val_metrics=val, nonfinite=nonfinite or {})

    rows = [row(1, 1, stored.metrics or {}, stored.val_metrics, stored.nonfinite_test),
            row(2, 2, {"accuracy": 0.7}, {"accuracy": 0.76}), row(3, 3, {"accuracy": 0.74}, {"accuracy": 0.78})]
    (summary,) = aggregate(rows)
    assert (summary.metric, summary.n, summary.mean) == ("accuracy", 2, pytest.approx(0.72))  # the NaN is no value
    assert (summary.val_n, summary.val_mean) == (3, pytest.approx(0.78))  # its val counts
    assert summary.n_text == "2 of 3 (seed 1 reported accuracy nan)"  # the n column names the value, as notes do
    assert summary.accounted == "2 of 3; seed 1 (job 1) reported a non-finite test accuracy (nan)"
    said = "reported a non-finite test accuracy (nan)"  # one phrase (nonfinite_said) in every view
    assert summary.notes == (f"seed 1 (job 1) {said}: not counted",
                             f"seed 1 (job 1): its val accuracy counted in the val mean, though it {said}")
    lines = [(line.seed, line.split, line.counted, line.why) for line in run_lines(rows, [summary]) if line.seed == 1]
    assert lines == [(1, "test", False, f"{said}, not counted"), (1, "val", True, f"{said}: its val counted")]

    # a run left out whose loss diverged says so in its note (no ♯: that marks counted runs)
    (gone,) = aggregate([ResultRow("E1", "r8", "glue_rte", 1, {}, job=4, nonfinite={"accuracy": "-inf"},
                                   diverged="final loss 4.6e+299 above the first steps' 1.1e+26")])
    assert gone.notes == ("seed 1 (job 4) reported a non-finite test accuracy (-inf) (its loss diverged, final loss "
                          "4.6e+299 above the first steps' 1.1e+26): not counted",)
    # a row none of whose runs has a finite f1 still shows f1 (each run named), not a fallback metric
    (mrpc,) = aggregate([ResultRow("E1", "r8", "glue_mrpc", s, {"accuracy": 0.9}, job=s, nonfinite={"f1": "nan"})
                         for s in (1, 2)])
    assert (mrpc.metric, mrpc.n, mrpc.mean) == ("f1", 0, None)
    assert "seed 2 (job 2) reported a non-finite test f1 (nan): not counted" in mrpc.notes
    # a counted run whose val is not finite: its test counts, its val is named and left out
    (half,) = aggregate([
        ResultRow("E1", "r8", "glue_rte", 1, {"accuracy": 0.7}, job=1, val_nonfinite={"accuracy": "inf"}),
        ResultRow("E1", "r8", "glue_rte", 2, {"accuracy": 0.8}, job=2, val_metrics={"accuracy": 0.9}),
    ])
    assert (half.n, half.val_n, half.val_mean) == (2, 1, 0.9)
    assert half.notes == ("seed 1 (job 1): a non-finite val accuracy (inf): its val not counted",)


def test_a_metric_too_large_to_average_is_named_as_a_non_finite_one_is(tmp_path: Path) -> None:
    # beyond 1e300 a value is no metric (its spread would overflow a float): missing for the run,
    # named in a note by the phrase a NaN gets, from result.json and from what a script printed
    from orchestrator.attempts.reported import reading_of
    from orchestrator.attempts.rundir_reads import read_result
    from tests.run_dirs import private_attempt_dir

    run_dir = private_attempt_dir(tmp_path)
    (run_dir / "result.json").write_text('{"metrics": {"test": {"accuracy": 1e305, "f1": 0.5, "big": 1' + "0" * 305
                                         + ', "edge": 1e300}, "val": {"accuracy": -2e301, "f1": 0.4}}}')
    reading = reading_of(read_result(run_dir), None)
    assert (reading.metrics, reading.val_metrics) == ({"f1": 0.5, "edge": 1e300}, {"f1": 0.4})
    assert (reading.nonfinite_test, reading.nonfinite_val) == ({"accuracy": "1e+305", "big": "1e+305"},
                                                               {"accuracy": "-2e+301"})
    assert reading_of(None, '{"accuracy": 3e300, "f1": 0.5}').nonfinite_test == {"accuracy": "3e+300"}
    # just beyond the bound reads as such, not as the bound itself (which is averaged)
    assert reading_of(None, '{"accuracy": 1.0000001e300}').nonfinite_test == {"accuracy": "1.0000001e+300"}
    rows = [ResultRow("E", "c", "glue_rte", 1, reading.metrics or {}, job=4, nonfinite=reading.nonfinite_test),
            ResultRow("E", "c", "glue_rte", 2, {"accuracy": 0.7}, job=5),
            ResultRow("E", "c", "glue_rte", 3, {"accuracy": 0.8}, job=6)]
    (summary,) = aggregate(rows)
    assert (summary.metric, summary.n, summary.mean) == ("accuracy", 2, pytest.approx(0.75))
    assert summary.notes == ("seed 1 (job 4) reported a test accuracy too large to average (1e+305): not counted",)


def test_a_metric_no_run_reported_is_refused_where_runs_reported_others() -> None:
    """`--metric acuracy` showed every seed as `reported no acuracy`, blaming the runs."""
    from orchestrator.errors import UsageError
    from orchestrator.lifecycle import JobState
    from orchestrator.results.table import check_metric_reported

    rows = [ResultRow("E1", "r8", "glue_rte", 1, {"accuracy": 0.7}, job=1, val_metrics={"loss": 0.4}),
            ResultRow("E1", "r8", "glue_rte", 2, {}, job=2, nonfinite={"f1": "nan"})]
    for metric in ("accuracy", "loss", "f1"):  # test, val, or reported only as NaN: all named by some run
        check_metric_reported(rows, metric)
    with pytest.raises(UsageError, match=r"^metric 'acuracy': no run here reported it \(did you mean 'accuracy'\?\) "
                                         r"\(reported: accuracy, f1, loss\)$"):
        check_metric_reported(rows, "acuracy")
    check_metric_reported([ResultRow("E1", "r8", "glue_rte", 1, {}, job=1)], "anything")  # nothing reported yet
    check_metric_reported(rows, "val_loss")  # a split's name: the table's note says where the split is
    running = ResultRow("E1", "r8", "glue_mrpc", 1, {}, job=3, state=JobState.RUNNING)
    check_metric_reported([*rows, running], "mcc")  # a run still going may report it

