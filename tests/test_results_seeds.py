"""The pure seed rules of a results row: one value per seed (the latest succeeded run), what each
seed not counted became, the denominator's words, and no std or bold for a single seed."""

from __future__ import annotations

import math

import pytest

from orchestrator.lifecycle import JobState
from orchestrator.results.aggregate import (
    ResultRow,
    ResultSummary,
    aggregate,
    mean_std,
    natural_key,
)
from orchestrator.results.formats import render_rows, score, to_records
from orchestrator.results.run_lines import run_lines
from orchestrator.results.seeds import (
    SeedRunInput,
    SeedStatus,
    counted_runs,
    full_denominator,
    seed_states,
    short_denominator,
)
from orchestrator.results.selection import Basis, choose, lower_is_better
from orchestrator.results.stats import paired_test
from orchestrator.spread import sample_std

S, F, C, R, Q = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.RUNNING, JobState.QUEUED


def test_the_latest_succeeded_run_of_a_seed_counts_unless_pooled() -> None:
    runs = [SeedRunInput(1, 1, S, True), SeedRunInput(1, 7, S, True), SeedRunInput(1, 9, F, False, "boom"),
            SeedRunInput(2, 2, S, True)]
    assert [r.job for r in counted_runs(runs, pooled=False)] == [7, 2]
    assert [r.job for r in counted_runs(runs, pooled=True)] == [1, 7, 2]


def test_each_seed_not_counted_says_what_it_became() -> None:
    runs = [SeedRunInput(1, 1, S, True), SeedRunInput(2, 2, F, False, "RuntimeError: x"),
            SeedRunInput(3, 3, F, False, "old"), SeedRunInput(3, 8, R, False),  # a retry still going decides
            SeedRunInput(4, 4, C, False), SeedRunInput(5, 5, Q, False),
            SeedRunInput(6, 6, S, False, "no f1"), SeedRunInput(6, 9, F, False, "later"),  # the newest decides
            SeedRunInput(7, 7, S, False, "no f1")]
    states = seed_states(runs)
    assert [(s.seed, s.status, s.job) for s in states] == [
        (1, SeedStatus.COUNTED, 1), (2, SeedStatus.FAILED, 2), (3, SeedStatus.RUNNING, 8),
        (4, SeedStatus.CANCELLED, 4), (5, SeedStatus.QUEUED, 5), (6, SeedStatus.FAILED, 9),
        (7, SeedStatus.NO_METRIC, 7)]
    assert short_denominator(1, states, "f1") == (
        "1 of 7 (seed 7 reported no f1; seeds 2, 6 failed; seed 4 cancelled; seed 3 running; seed 5 queued)")
    assert full_denominator(1, states, "f1").startswith("1 of 7; seed 2 (job 2) failed: RuntimeError: x; ")


def test_a_seed_whose_value_was_not_finite_is_named_by_its_value_not_as_reporting_none() -> None:
    runs = [SeedRunInput(1, 1, S, True), SeedRunInput(2, 2, S, False, "a non-finite test f1 (nan)", "nan"),
            SeedRunInput(3, 3, S, False, "a non-finite test f1 (nan)", "nan"),
            SeedRunInput(4, 4, S, False, "a test f1 too large to average (1e+305)", "1e+305"),
            SeedRunInput(5, 5, S, False, "a test f1 too large to average", "too large"),
            SeedRunInput(6, 6, S, False, "no f1")]
    states = seed_states(runs)
    assert short_denominator(1, states, "f1") == (
        "1 of 6 (seeds 2, 3 reported f1 nan; seed 4 reported f1 1e+305; seed 5 reported a f1 too large to average; "
        "seed 6 reported no f1)")
    assert full_denominator(1, states, "f1") == (
        "1 of 6; seed 2 (job 2) reported a non-finite test f1 (nan); seed 3 (job 3) reported a non-finite test f1 (nan)"
        "; seed 4 (job 4) reported a test f1 too large to average (1e+305); seed 5 (job 5) reported a test f1 too "
        "large to average; seed 6 (job 6) reported no f1")


def test_a_seed_that_ran_twice_and_counts_in_neither_names_both_runs() -> None:
    """A pruned seed queued again with --force (pruned at once): its row named job 27 only."""
    from orchestrator.results.seeds import later_run_notes

    runs = [SeedRunInput(1, 3, JobState.PRUNED, False, "pruned at step 20"),
            SeedRunInput(1, 27, JobState.PRUNED, False, "pruned at step 20"), SeedRunInput(2, 4, S, True)]
    notes = later_run_notes(runs, seed_states(runs), False, lambda jobs: f" (jobs {', '.join(map(str, jobs))})")
    assert notes == ["seed 1 ran twice (jobs 3, 27): the latest, job 27, decides what its row says"]


def test_a_rerun_that_failed_decides_over_an_earlier_run_without_the_metric_in_every_view() -> None:
    """Seed 1 ran as job 30 (succeeded, no accuracy), then again as job 54 (failed: boom): the
    newest run decides what the row says of seed 1 (n, notes, seed_states), as the per-run lines do."""
    rows = [ResultRow("E", "r8", "toy", 1, {}, job=30, no_metrics="no test metrics"),
            ResultRow("E", "r8", "toy", 1, {}, job=54, state=F, reason="boom"),
            ResultRow("E", "r8", "toy", 2, {"accuracy": 0.5}, job=31),
            ResultRow("E", "r8", "toy", 3, {"accuracy": 0.7}, job=32)]
    (summary,) = aggregate(rows)
    assert summary.n_text == "2 of 3 (seed 1 failed)"
    assert summary.accounted == "2 of 3; seed 1 (job 54) failed: boom"
    assert (summary.seed_states[0].status, summary.seed_states[0].job) == (SeedStatus.FAILED, 54)
    assert "seed 1 (job 54) failed, not counted: boom" in summary.notes
    (record,) = to_records([summary])
    assert record["seed_states"][0] == {"seed": 1, "status": "failed", "job": 54, "why": "boom"}
    lines = {line.job: line for line in run_lines(rows, [summary]) if line.seed == 1}
    assert (lines[54].state, lines[54].counted, lines[54].why) == ("failed", False, "failed: boom, not counted")


def test_a_long_list_of_seeds_is_cut() -> None:
    states = seed_states([SeedRunInput(seed, seed, F, False) for seed in range(10)])
    assert short_denominator(0, states, "accuracy") == "0 of 10 (seeds 0, 1, 2, 3, 4, 5, +4 more failed)"


def test_rows_of_settings_that_never_succeeded_and_runs_still_going() -> None:
    rows = [ResultRow("E", "bad", "glue_rte", seed, {}, job=seed, state=F, reason="ValueError: nan") for seed in (1, 2)]
    rows += [ResultRow("E", "going", "glue_rte", 1, {"accuracy": 0.5}, job=3),
             ResultRow("E", "going", "glue_rte", 2, {}, job=4, state=R),
             ResultRow("E", "going", "glue_rte", 1, {}, job=5, state=Q)]  # a rerun of seed 1, queued
    bad, going = aggregate(rows)
    assert (bad.mean, bad.std, bad.n, bad.failed_runs, bad.unfinished) == (None, None, 0, True, False)
    assert bad.notes == ("seed 1 (job 1) failed, not counted: ValueError: nan",
                         "seed 2 (job 2) failed, not counted: ValueError: nan")
    assert (going.n, going.n_text, going.unfinished, going.failed_runs) == (1, "1 of 2 (seed 2 running)", True, False)
    assert going.notes == ("seed 1: a later run, job 5, has not finished; job 3 counted",)
    assert render_rows([going])[0][5] == "0.5000 ± — ◇"  # one value: no std, and the row may change


def test_a_std_of_values_near_the_metric_bound_is_computed_not_overflowed() -> None:
    # metrics up to 1e300 count (wording.MAX_METRIC): their deviations' squares leave a float's
    # range, so the std is computed scaled; values of a common size give the same bits as before
    mean, std = mean_std([1e200, 3e200])
    assert (mean, std) == (2e200, pytest.approx(2 ** 0.5 * 1e200))
    assert mean_std([-1e300, 1e300]) == (0.0, pytest.approx(2 ** 0.5 * 1e300))
    values = [0.4, 0.6, 0.65]
    plain = sum(values) / 3
    assert mean_std(values) == (plain, math.sqrt(sum((v - plain) ** 2 for v in values) / 2))
    (row,) = aggregate([ResultRow("E", "c", "toy", s, {"loss": v}) for s, v in ((1, 1e300), (2, -1e300))])
    assert (row.n, row.mean, row.std) == (2, 0.0, pytest.approx(2 ** 0.5 * 1e300))


def test_a_paired_test_over_metrics_near_the_bound_is_the_scaled_one() -> None:
    # the pairs' differences near 1e300 squared past a float's range, and scipy said t = 0, p = 1
    # without a word: t and p are those of the same values at a common size
    pytest.importorskip("scipy")

    def pair(scale: float) -> tuple[ResultSummary, ResultSummary]:
        values = {"a": (3.0, 5.0, 4.5), "b": (1.0, 2.0, 2.2)}
        a, b = aggregate([ResultRow("E", c, "t", s, {"loss": v * scale}) for c, vs in values.items()
                          for s, v in zip((1, 2, 3), vs, strict=True)])
        return a, b

    small, big = paired_test(*pair(1.0)), paired_test(*pair(1e299))
    assert small.t is not None and small.t > 8 and (big.t, big.p) == (pytest.approx(small.t), pytest.approx(small.p))
    assert sample_std([1e300, -1e300, 0.0]) == pytest.approx(1e300)


def test_no_std_and_no_choice_for_a_single_seed() -> None:
    assert mean_std([0.5]) == (0.5, None) and mean_std([]) == (None, None)
    assert mean_std([0.4, 0.6])[1] == pytest.approx(0.1414, abs=1e-4)
    rows = [ResultRow("E", "one", "toy", 1, {"accuracy": 0.99}, val_metrics={"accuracy": 0.99}),
            ResultRow("E", "two", "toy", 1, {"accuracy": 0.6}, val_metrics={"accuracy": 0.7}),
            ResultRow("E", "two", "toy", 2, {"accuracy": 0.8}, val_metrics={"accuracy": 0.9})]
    one, two = aggregate(rows)
    assert score(one, 4) == "0.9900 ± —"
    (choice,) = choose([one, two], 4).values()
    assert choice.basis is Basis.VAL and choice.chosen == {id(two)}
    assert (two.val_mean, two.val_n) == (pytest.approx(0.8), 2)


def test_selection_on_val_never_falls_back_to_test_when_asked_for_val() -> None:
    rows = [ResultRow("E", c, "toy", s, {"accuracy": v}) for c, s, v in [("a", 1, 0.5), ("a", 2, 0.6)]]
    (summary,) = aggregate(rows)
    (by_default,) = choose([summary], 4).values()
    (by_val,) = choose([summary], 4, Basis.VAL).values()
    assert by_default.basis is Basis.TEST  # no val reported: chosen on test, and the legend says so
    assert by_val.chosen == frozenset()


def test_names_sort_with_their_numbers_as_numbers_and_losses_are_lowest_best() -> None:
    assert sorted(["r64", "r8", "r16"], key=natural_key) == ["r8", "r16", "r64"]
    assert lower_is_better("perplexity") and lower_is_better("val_loss") and not lower_is_better("accuracy")


def test_a_seed_that_failed_then_succeeded_counts_without_the_lost_mark() -> None:
    rows = [ResultRow("E", "a", "glue_rte", 1, {"accuracy": 0.5}, job=1),
            ResultRow("E", "a", "glue_rte", 2, {}, job=2, state=F, reason="CUDA error: launch failure"),
            ResultRow("E", "a", "glue_rte", 2, {"accuracy": 0.7}, job=3)]  # seed 2 run again, and it worked
    (summary,) = aggregate(rows)
    assert (summary.n, summary.n_text, summary.failed_runs) == (2, "2", False)
    assert summary.notes == ("seed 2: an earlier run, job 2, failed (CUDA error: launch failure); job 3 counted",)
    after = aggregate([*rows, ResultRow("E", "a", "glue_rte", 1, {}, job=4, state=C)])[0]
    assert after.failed_runs is True and after.n_text == "2"  # a rerun after the counted one was cancelled


def test_pooled_denominators_count_distinct_seeds_and_one_seed_is_never_chosen() -> None:
    # seed 1 ran three times, seed 2 failed: one seed of two counts, whatever the runs
    rows = [ResultRow("E", "rerun", "glue_rte", 1, {"accuracy": value}, job=job)
            for job, value in ((1, 0.9), (2, 0.91), (3, 0.92))]
    rows.append(ResultRow("E", "rerun", "glue_rte", 2, {}, job=4, state=F, reason="boom"))
    rows += [ResultRow("E", "two", "glue_rte", seed, {"accuracy": 0.5}, job=4 + seed) for seed in (1, 2)]
    rerun, two = aggregate(rows, pooled=True)
    assert (rerun.n, rerun.distinct_seeds) == (3, 1)
    assert rerun.n_text == "1 of 2 (seed 2 failed) (3 runs)"
    assert rerun.accounted.startswith("1 of 2 (3 runs); seed 2 (job 4) failed: boom")
    assert two.n_text == "2"
    chosen = choose([rerun, two], digits=3)[("glue_rte", rerun.metric)].chosen
    assert chosen == frozenset({id(two)})  # the higher mean of one seed is no evidence
    (alone,) = aggregate(rows[:3], pooled=True)
    assert alone.n_text == "1 (3 runs)" and choose([alone], digits=3)[("glue_rte", alone.metric)].basis is None
