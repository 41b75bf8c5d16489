"""Early stopping's pure core (orchestrator.scheduling.early_stop) and its spec (plans.early_stop):
which settings Optuna's pruners stop, from histories given as values."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from orchestrator.daemon.early_stop import spared_words
from orchestrator.errors import PlanError
from orchestrator.lifecycle import JobState
from orchestrator.plans.early_stop import (
    EarlyStop,
    Mode,
    PruneRule,
    SeedValue,
    describe_pruned,
    parse_early_stop,
)
from orchestrator.scheduling.early_stop import SeedRun, SettingRuns, judge, setting_value, value_at

R, S, Q, F = JobState.RUNNING, JobState.SUCCEEDED, JobState.QUEUED, JobState.FAILED


def _curve(final: float, up_to: int) -> dict[float, float]:
    return {float(step): final * step / (step + 20) for step in range(10, up_to + 1, 10)}


def _grid(finals: list[float], up_to: int, seeds: int = 1) -> list[SettingRuns]:
    job_id = 0
    settings = []
    for index, final in enumerate(finals):
        runs = []
        for _ in range(seeds):
            job_id += 1
            runs.append(SeedRun(job_id, R, _curve(final, up_to), float(up_to)))
        settings.append(SettingRuns(f"lr{index}", tuple(runs)))
    return settings


ASHA = EarlyStop("val_accuracy", Mode.MAX, PruneRule.ASHA, min_steps=10, reduction_factor=3)


def test_asha_stops_the_worst_and_never_the_best() -> None:
    finals = [0.5, 0.6, 0.9, 0.55, 0.65, 0.52, 0.58, 0.62, 0.51]
    judged = judge(ASHA, _grid(finals, 30), [])
    stopped = {p.setting for p in judged.prunes}
    assert "lr2" not in stopped  # the best
    assert len(stopped) >= 4
    first = judged.prunes[0]
    assert first.step == 10 and 1 <= first.rank <= first.of <= 9
    assert {(r.setting, r.rung) for r in judged.told} >= {(f"lr{i}", 0) for i in range(9)}


def test_told_again_after_a_restart_changes_nothing() -> None:
    settings = _grid([0.5, 0.6, 0.9, 0.55, 0.65, 0.52, 0.58, 0.62, 0.51], 30)
    first = judge(ASHA, settings, [])
    pruned = {p.setting for p in first.prunes}
    after = [SettingRuns(s.key, s.seeds, decided=s.key in pruned) for s in settings]
    again = judge(ASHA, after, first.told)
    assert again.prunes == [] and again.told == []  # no rung told twice, nothing judged twice


def test_a_setting_waits_for_every_seed_and_is_judged_on_their_mean() -> None:
    behind = SettingRuns("x", (SeedRun(1, R, {10.0: 0.5, 20.0: 0.6}, 20.0), SeedRun(2, Q, {}, 0.0)))
    assert setting_value(behind, 10) is None
    both = SettingRuns(
        "x",
        (
            SeedRun(1, R, {10.0: 0.5, 20.0: 0.6}, 20.0),
            SeedRun(2, R, {12.0: 0.7}, 12.0),
            SeedRun(3, F, {}, 0.0),
        ),
    )
    assert setting_value(both, 10) is None  # seed 2 reported nothing at or before step 10
    assert value_at({5.0: 0.2, 12.0: 0.7}, 10) == 0.2
    assert setting_value(
        SettingRuns("x", (SeedRun(1, R, {10.0: 0.5}, 10.0), SeedRun(2, R, {10.0: 0.7}, 10.0))), 10
    ) == pytest.approx(0.6)


def test_a_metric_never_reported_stops_nothing_and_is_said() -> None:
    settings = [SettingRuns(f"s{i}", (SeedRun(i, R, {}, 50.0),)) for i in range(6)]
    judged = judge(ASHA, settings, [])
    assert judged.prunes == [] and judged.told == []
    assert judged.metric_missing_at == 10


def test_mode_min_keeps_the_lowest_loss() -> None:
    spec = EarlyStop("val_loss", Mode.MIN, PruneRule.ASHA, min_steps=10, reduction_factor=2)
    finals = [3.0, 1.0, 2.0, 2.5]
    judged = judge(spec, _grid(finals, 20), [])
    assert "lr1" not in {p.setting for p in judged.prunes}
    assert judged.prunes


def test_median_compares_with_finished_settings() -> None:
    spec = EarlyStop("val_accuracy", Mode.MAX, PruneRule.MEDIAN, min_steps=10, reduction_factor=2)
    done = [
        SettingRuns(f"done{i}", (SeedRun(i, S, _curve(f, 40), 40.0),))
        for i, f in enumerate([0.8, 0.9, 0.85])
    ]
    weak = SettingRuns("weak", (SeedRun(9, R, _curve(0.3, 20), 20.0),))
    strong = SettingRuns("strong", (SeedRun(10, R, _curve(0.95, 20), 20.0),))
    judged = judge(spec, [*done, weak, strong], [])
    assert [p.setting for p in judged.prunes] == ["weak"]
    assert judged.prunes[0].job_ids == (9,)


def test_hyperband_runs_on_optuna() -> None:
    spec = EarlyStop(
        "val_accuracy",
        Mode.MAX,
        PruneRule.HYPERBAND,
        min_steps=10,
        reduction_factor=3,
        max_steps=90,
    )
    finals = [
        0.7 - 0.01 * i for i in range(20)
    ]  # the first is the best: the later ones are judged against it
    judged = judge(spec, _grid(finals, 90), [])
    assert "lr0" not in {p.setting for p in judged.prunes}
    assert judged.prunes


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({"metric": "m", "rule": "bohb", "min_steps": 5}, "unknown `early_stop.rule`"),
        (
            {"metric": "m", "min_steps": 5, "reduction_factor": 1},
            "reduction_factor` must be an integer from 2 to 100, not 1",
        ),
        (
            {"metric": "m", "min_steps": 5, "reduction_factor": 10**12},
            "reduction_factor` must be an integer from 2 to 100, not 1000000000000",
        ),
        ({"metric": "m", "min_steps": "4"}, "min_steps` must be an integer from 1 to 1000000000, not '4'"),
        ({"metric": "m", "min_steps": 0}, "min_steps` must be an integer from 1 to 1000000000, not 0"),
        ({"metric": "m", "min_steps": 3, "smooth_evals": 101}, "smooth_evals` must be an integer from 1 to 100"),
        (
            {"metric": "m", "min_steps": 3, "smoothing": 3},
            "unknown key(s) smoothing (`early_stop` must be a mapping of metric, mode (max|min), "
            "rule (asha|hyperband|median), min_steps, reduction_factor, max_steps (hyperband), smooth_evals, "
            "value (last|best), margin_se (asha))",
        ),
        ({"metric": "m"}, "min_steps` is required"),
        ({"min_steps": 3}, "early_stop.metric` must name"),
        ({"metric": "m", "min_steps": 3, "mode": "up"}, "mode` must be max or min"),
        ({"metric": "m", "min_steps": 3, "mode": None}, "mode` must be max or min, not null (an empty value)"),
        ({"metric": "m", "min_steps": 3, "patience": 2}, "unknown key(s) patience"),
        ({"metric": "m", "min_steps": 3, "max_steps": 9}, "takes none"),
        ("asha", "must be a mapping"),
    ],
)
def test_bad_rules_are_refused_in_one_line(raw: object, said: str) -> None:
    with pytest.raises(PlanError) as info:
        parse_early_stop("suite s.yaml", raw)
    assert said in str(info.value) and "\n" not in str(info.value)


def test_rung_steps_and_round_trip() -> None:
    spec = parse_early_stop(
        "s", {"metric": "val_accuracy", "rule": "asha", "min_steps": 200, "reduction_factor": 3}
    )
    assert spec.rung_steps(2000) == [200, 600, 1800]
    assert EarlyStop.from_json(spec.to_json()) == spec


def test_settings_reaching_a_rung_together_are_compared_with_one_another() -> None:
    # told in submit order, worst first: none is kept for merely being told before the others
    finals = [0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9]
    judged = judge(ASHA, _grid(finals, 10), [])
    kept = {f"lr{i}" for i in range(9)} - {p.setting for p in judged.prunes}
    assert kept == {"lr6", "lr7", "lr8"}  # the top third, as successive halving keeps
    assert [p.rank for p in judged.prunes if p.setting == "lr0"] == [9]


def test_a_setting_kept_for_arriving_first_is_stopped_once_better_ones_arrive() -> None:
    finals = [0.5, 0.7, 0.72, 0.74, 0.76, 0.78]
    alone = _grid(finals[:1], 10)
    first = judge(ASHA, alone, [])
    assert first.prunes == [] and [r.setting for r in first.told] == [
        "lr0"
    ]  # alone at the rung: goes on
    everyone = [SettingRuns("lr0", (SeedRun(1, R, _curve(0.5, 20), 20.0),)), *_grid(finals, 10)[1:]]
    later = judge(ASHA, everyone, first.told)
    assert "lr0" in {p.setting for p in later.prunes}  # judged again at the rung it passed
    assert {r.setting for r in later.told} == {
        f"lr{i}" for i in range(1, 6)
    }  # lr0 told once, before


def test_a_setting_that_finished_before_its_rivals_reach_a_rung_is_never_judged_there() -> None:
    # lr0 finishes (its one seed succeeded) before five better settings reach the first rung: it
    # is told there, so they are compared with it, but it is never judged (the same setting still
    # running is stopped once they arrive, the test above), whether a check saw it at the rung
    # before it finished or not
    finals = [0.5, 0.7, 0.72, 0.74, 0.76, 0.78]
    first = judge(ASHA, _grid(finals[:1], 10), [])
    done = SettingRuns("lr0", (SeedRun(1, S, _curve(0.5, 20), 20.0),))
    for told_before in (first.told, []):
        later = judge(ASHA, [done, *_grid(finals, 10)[1:]], told_before)
        assert "lr0" not in {p.setting for p in later.prunes}
        assert later.prunes and all(p.of == 6 for p in later.prunes if p.rung == 0)  # lr0 among them


def test_a_setting_judged_again_counts_once_among_those_at_its_rung() -> None:
    # lr0 reached the rung alone and went on; four more arrive, one better. Of five at the rung,
    # successive halving (reduction 3) keeps the best alone: lr0, second, is stopped. Its own
    # record at the rung, counted beside the value judged, made six, which keeps two
    alone = judge(ASHA, _grid([0.76], 10), [])
    assert alone.prunes == []
    everyone = [SettingRuns("lr0", (SeedRun(1, R, _curve(0.76, 20), 20.0),)),
                *[SettingRuns(f"lr{n}", (SeedRun(n + 1, R, _curve(final, 10), 10.0),))
                  for n, final in enumerate([0.5, 0.6, 0.7, 0.8], start=1)]]
    later = judge(ASHA, everyone, alone.told)
    stopped = {p.setting: p for p in later.prunes}
    assert set(stopped) == {"lr0", "lr1", "lr2", "lr3"}
    assert (stopped["lr0"].rank, stopped["lr0"].of) == (2, 5)


def test_settings_past_two_rungs_in_one_check_are_each_counted_once_at_each() -> None:
    # five settings reach rungs 0 (step 10) and 1 (step 30) in one check: of five at rung 0,
    # successive halving keeps the best alone (lr3); lr4, second there, is stopped at rung 0
    # however it leads at step 30
    at_10, at_30 = [0.5, 0.6, 0.7, 0.8, 0.76], [0.5, 0.6, 0.7, 0.85, 0.9]
    settings = [SettingRuns(f"lr{n}", (SeedRun(n + 1, R, {10.0: a, 30.0: b}, 30.0),))
                for n, (a, b) in enumerate(zip(at_10, at_30, strict=True))]
    judged = judge(ASHA, settings, [])
    assert {p.setting: p.rung for p in judged.prunes} == {"lr0": 0, "lr1": 0, "lr2": 0, "lr4": 0}


@pytest.mark.parametrize("rule", [PruneRule.ASHA, PruneRule.HYPERBAND])
def test_the_pruner_compares_a_setting_with_each_setting_at_its_rung_once(
    rule: PruneRule, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what successive halving (alone, or in Hyperband's one bracket here) compares a value with:
    # the nine settings at the rung, the judged one among them once
    from optuna.pruners import _successive_halving

    compared: list[int] = []
    original = _successive_halving._get_competing_values

    def counted(trials: Any, value: float, rung_key: str) -> list[float]:
        competing = original(trials, value, rung_key)
        compared.append(len(competing))
        return competing

    monkeypatch.setattr(_successive_halving, "_get_competing_values", counted)
    spec = EarlyStop("val_accuracy", Mode.MAX, rule, min_steps=10, reduction_factor=3,
                     max_steps=20 if rule is PruneRule.HYPERBAND else None)  # 20 of 10 by 3: one bracket
    judge(spec, _grid([0.5, 0.6, 0.9, 0.55, 0.65, 0.52, 0.58, 0.62, 0.51], 10), [])
    # told one by one first (each recorded beside those before it), then each judged
    assert compared[:9] == list(range(1, 10)) and len(compared) > 9 and set(compared[9:]) == {9}, compared


def test_an_early_stop_suite_queues_its_settings_shuffled_seeds_together() -> None:
    from orchestrator.plans.model import JobSpec
    from orchestrator.submit.core import settings_shuffled

    specs = [
        JobSpec("s", "base", "p", {}, seed, "t", {"learning_rate": lr}, {}, f"{lr}-{seed}")
        for lr in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
        for seed in (1, 2, 3)
    ]
    shuffled = settings_shuffled(specs, "s")
    assert shuffled == settings_shuffled(specs, "s") and sorted(shuffled, key=specs.index) == specs
    order = [float(str(s.overrides["learning_rate"])) for s in shuffled]
    assert order != sorted(order)
    assert all(order[i] == order[i + 1] == order[i + 2] for i in range(0, 18, 3))  # seeds together


def test_smooth_evals_judges_a_seed_on_the_mean_of_its_last_evaluations() -> None:
    values = {10.0: 0.5, 20.0: 0.6, 30.0: 0.9, 40.0: 0.7}
    assert value_at(values, 30.0) == 0.9
    assert value_at(values, 30.0, smooth_evals=3) == pytest.approx((0.5 + 0.6 + 0.9) / 3)
    assert value_at(values, 35.0, smooth_evals=2) == pytest.approx(0.75)  # 20 and 30: at or before 35
    assert value_at(values, 10.0, smooth_evals=3) == 0.5  # fewer evaluations than the window
    assert value_at(values, 50.0, smooth_evals=3) is None  # not reported at or past the step
    # one lucky evaluation at the rung: judged on it alone it ranks first, on the mean of 3 last
    lucky = SeedRun(1, R, {8.0: 0.50, 9.0: 0.50, 10.0: 0.80, 20.0: 0.6}, 20.0)
    steady = [SeedRun(i, R, {8.0: 0.62, 9.0: 0.62, 10.0: 0.62, 20.0: 0.7}, 20.0) for i in range(2, 5)]
    settings = [SettingRuns("lucky", (lucky,))] + [SettingRuns(f"s{s.job_id}", (s,)) for s in steady]
    plain = judge(ASHA, settings, [])
    smoothed_spec = EarlyStop("val_accuracy", Mode.MAX, PruneRule.ASHA, 10, 3, smooth_evals=3)
    smoothed = judge(smoothed_spec, settings, [])
    assert "lucky" not in {p.setting for p in plain.prunes}
    stop = next(p for p in smoothed.prunes if p.setting == "lucky")
    assert stop.value == pytest.approx(0.6) and stop.rank == 4
    assert stop.record(smoothed_spec)["smooth_evals"] == 3 and "smooth_evals" not in stop.record(ASHA)
    assert describe_pruned(stop.record(smoothed_spec)) == (
        "pruned at step 10 (val_accuracy 0.6 (the setting's mean over its seeds of the last 3 evaluations), ranked 4 "
        "of 4 at that step; asha)"
    )


def test_smooth_evals_is_checked_and_kept() -> None:
    raw = {"metric": "m", "min_steps": 5, "smooth_evals": 3}
    spec = parse_early_stop("s", raw)
    assert spec.smooth_evals == 3 and EarlyStop.from_json(spec.to_json()) == spec
    assert "smooth_evals" not in parse_early_stop("s", {"metric": "m", "min_steps": 5}).to_json()
    for bad, said in ((0, "from 1 to 100, not 0"), (101, "from 1 to 100, not 101"), ("3", "not '3'"),
                      (True, "not True")):
        with pytest.raises(PlanError) as info:
            parse_early_stop("suite s.yaml", {**raw, "smooth_evals": bad})
        assert "`early_stop.smooth_evals` must be" in str(info.value) and said in str(info.value)
        assert "\n" not in str(info.value)


def test_value_best_judges_a_seed_on_its_best_evaluation_so_far() -> None:
    losses = {16.0: 0.70, 32.0: 0.52, 48.0: 0.61, 64.0: 0.45}
    assert value_at(losses, 48.0, best_of=Mode.MIN) == 0.52  # the bump at 48 passed over
    assert value_at(losses, 48.0) == 0.61
    assert value_at(losses, 40.0, best_of=Mode.MAX) == 0.70
    assert value_at(losses, 70.0, best_of=Mode.MIN) is None  # not reported at or past the step
    # a large rate's loss rises after its warm-up, right at the rung, and comes down later: judged
    # on its last value it ranks last of 4 and is stopped; on its best so far it leads
    bumped = SeedRun(1, R, {32.0: 0.40, 48.0: 0.80, 96.0: 0.35}, 96.0)
    steady = [SeedRun(i, R, {32.0: 0.60, 48.0: 0.58, 96.0: 0.55}, 96.0) for i in range(2, 5)]
    settings = [SettingRuns("bumped", (bumped,))] + [SettingRuns(f"s{s.job_id}", (s,)) for s in steady]
    last_spec = EarlyStop("val_loss", Mode.MIN, PruneRule.ASHA, 48, 3)
    best_spec = EarlyStop("val_loss", Mode.MIN, PruneRule.ASHA, 48, 3, value=SeedValue.BEST)
    assert best_spec.best_of() is Mode.MIN and last_spec.best_of() is None
    stop = next(p for p in judge(last_spec, settings, []).prunes if p.setting == "bumped")
    assert stop.value == pytest.approx(0.80) and stop.rank == 4
    best = judge(best_spec, settings, [])
    assert "bumped" not in {p.setting for p in best.prunes}
    assert {r.setting: r.value for r in best.told}["bumped"] == pytest.approx(0.40)
    worst = next(p for p in best.prunes)
    assert worst.record(best_spec)["seed_value"] == "best" and "seed_value" not in worst.record(last_spec)
    assert describe_pruned(worst.record(best_spec)) == (
        f"pruned at step 48 (val_loss {worst.value:.4g} (the setting's mean of each seed's best so far), ranked "
        f"{worst.rank} of 4 "
        "at that step; asha)"
    )


def test_value_is_checked_and_kept() -> None:
    raw = {"metric": "val_loss", "mode": "min", "min_steps": 5, "value": "best"}
    spec = parse_early_stop("s", raw)
    assert spec.value is SeedValue.BEST and EarlyStop.from_json(spec.to_json()) == spec
    assert parse_early_stop("s", {**raw, "value": "last"}).value is SeedValue.LAST
    assert "value" not in parse_early_stop("s", {"metric": "m", "min_steps": 5}).to_json()  # as stored before
    for bad, said in (
        ({"value": "mean"}, "`early_stop.value` must be last or best, not 'mean'"),
        ({"value": True}, "`early_stop.value` must be last or best, not 'True'"),
        ({"smooth_evals": 3}, "`early_stop.value: best` takes each seed's best value so far, "
                              "`smooth_evals: 3` the mean of its last ones: choose one"),
    ):
        with pytest.raises(PlanError) as info:
            parse_early_stop("suite s.yaml", {**raw, **bad})
        assert str(info.value) == f"suite s.yaml: {said}"


def test_a_leader_at_a_later_rung_is_never_stopped_for_an_earlier_one() -> None:
    # A ran ahead alone to the second rung (step 30); eight settings then reach the first rung
    # above A's value there: A is judged at its last rung only, where it leads (stopped for
    # rung 0, every leader of a later rung could go, and the whole grid with them)
    ahead = SettingRuns("A", (SeedRun(1, R, {10.0: 0.50, 30.0: 0.80}, 30.0),))
    first = judge(ASHA, [ahead], [])
    assert first.prunes == [] and {r.rung for r in first.told} == {0, 1}
    late = [SettingRuns(f"s{i}", (SeedRun(i + 2, R, {10.0: 0.6 + i / 100}, 10.0),)) for i in range(8)]
    again = judge(ASHA, [ahead, *late], first.told)
    assert "A" not in {p.setting for p in again.prunes}
    assert {p.setting for p in again.prunes} >= {"s0", "s1", "s2"}  # the worst at the first rung


def test_the_benchmark_explains_each_seed_and_counts_ties(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import curve_family, early_stop_sim

    argv = ["--curves", "parametric", "--seeds", "2", "--no-search", "--explain", "--smooth-evals", "3"]
    assert early_stop_sim.main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.count("  grid best lr=") == 2 and "true rank" in printed and "rung 0: " in printed
    assert "smooth_evals 3" in printed and "tied with the grid best" in printed and "parametric curves" in printed
    assert curve_family.true_best() == "lr=0.000251 r=16"  # 0.00002 above lr=0.000158 r=16: a tie
    assert curve_family.mean_se() == pytest.approx(0.005 / 3**0.5)


def test_a_suite_without_tasks_is_named_alone() -> None:
    from orchestrator.store.early_stop import where

    assert where("es", "") == "es" and where("es", "glue-tvt_rte") == "es on glue-tvt_rte"


def test_margin_se_is_checked_and_kept() -> None:
    raw = {"metric": "val_loss", "mode": "min", "min_steps": 5, "margin_se": 1}
    spec = parse_early_stop("s", raw)
    assert spec.margin_se == 1.0 and EarlyStop.from_json(spec.to_json()) == spec
    assert "margin_se" not in parse_early_stop("s", {"metric": "m", "min_steps": 5}).to_json()  # as stored before
    for bad, said in (
        ({"margin_se": -0.5}, "`early_stop.margin_se` must be a number of standard errors from 0 to 10, not -0.5"),
        ({"margin_se": "one"}, "`early_stop.margin_se` must be a number of standard errors from 0 to 10, not 'one'"),
        ({"margin_se": "2e1"}, "`early_stop.margin_se` must be a number of standard errors from 0 to 10, not 20.0"),
        ({"margin_se": True}, "`early_stop.margin_se` must be a number of standard errors from 0 to 10, not True"),
        ({"rule": "median"}, "`early_stop.margin_se` spares settings near asha's cutoff; rule median takes none"),
    ):
        with pytest.raises(PlanError) as info:
            parse_early_stop("suite s.yaml", {**raw, **bad})
        assert str(info.value) == f"suite s.yaml: {said}"
    # YAML 1.1 reads `5e-1` (no dot) as text: the number it spells, as search bounds take it
    written = yaml.safe_load("margin_se: 5e-1")
    assert written == {"margin_se": "5e-1"}
    assert parse_early_stop("s", {**raw, **written}).margin_se == 0.5


def _two_seeds(key: str, first: float, second: float, job_id: int, up_to: int) -> SettingRuns:
    values = [{float(s): v for s in range(10, up_to + 1, 10)} for v in (first, second)]
    seeds = (SeedRun(job_id, R, values[0], float(up_to)), SeedRun(job_id + 1, R, values[1], float(up_to)))
    return SettingRuns(key, seeds)


def _noisy_grid(up_to: int) -> list[SettingRuns]:
    """Nine settings of two seeds at a rung of factor 3: the cutoff is the third best, 0.7;
    `close` (0.69, seeds 0.64 and 0.74: a standard error of 0.05) is 4th, `far` (0.5) last."""
    means = {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6, "e": 0.58, "f": 0.56, "g": 0.54}
    grid = [_two_seeds(k, m - 0.001, m + 0.001, 10 * i, up_to) for i, (k, m) in enumerate(means.items())]
    return [*grid, _two_seeds("close", 0.64, 0.74, 100, up_to), _two_seeds("far", 0.49, 0.51, 110, up_to)]


def test_a_margin_spares_a_setting_within_its_seeds_noise_of_the_cutoff_and_only_that() -> None:
    with_margin = EarlyStop("val_accuracy", Mode.MAX, PruneRule.ASHA, min_steps=10, margin_se=1.0)
    plain = {p.setting for p in judge(ASHA, _noisy_grid(10), []).prunes}
    assert {"close", "far"} <= plain  # the test can fail: the pruner alone stops both
    first = judge(with_margin, _noisy_grid(10), [])
    assert {p.setting for p in first.prunes} == plain - {"close"}  # the margin only spares
    kept = next(k for k in first.spared if k.setting == "close")  # what the daemon says it did
    assert (kept.step, kept.cutoff) == (10, pytest.approx(0.7)) and kept.standard_error == pytest.approx(0.05)
    assert spared_words(with_margin, kept) == (
        "kept at step 10 by margin_se: setting close, val_accuracy 0.69 (the setting's mean over its seeds), "
        "0.01 from the rung's cutoff 0.7, within margin_se 1 × its standard error 0.05"
    )
    assert not judge(ASHA, _noisy_grid(10), []).spared
    assert first.prunes[0].record(with_margin)["margin_se"] == 1.0
    # judged again at its rung later (a running setting is, at its last rung): still spared
    stopped = {p.setting for p in first.prunes}
    later = [SettingRuns(s.key, s.seeds, decided=s.key in stopped) for s in _noisy_grid(20)]
    assert "close" not in {p.setting for p in judge(with_margin, later, first.told).prunes}
    assert "close" in {p.setting for p in judge(ASHA, later, first.told).prunes}
    narrow = EarlyStop("val_accuracy", Mode.MAX, PruneRule.ASHA, min_steps=10, margin_se=0.1)
    assert {p.setting for p in judge(narrow, _noisy_grid(10), []).prunes} == plain  # 0.01 > 0.1 × 0.05


def test_a_margin_over_metrics_near_the_bound_is_computed_not_an_overflow() -> None:
    # history keeps values up to 1e300: the seeds' spread squared left a float's range, and the
    # OverflowError turned early stopping off for the suite; the same grid scaled judges the same
    with_margin = EarlyStop("val_accuracy", Mode.MAX, PruneRule.ASHA, min_steps=10, margin_se=1.0)
    scaled = [SettingRuns(s.key, tuple(SeedRun(r.job_id, r.state, {k: v * 1e300 for k, v in r.values.items()},
                                               r.reached_step) for r in s.seeds)) for s in _noisy_grid(10)]
    plain, big = judge(with_margin, _noisy_grid(10), []), judge(with_margin, scaled, [])
    assert {p.setting for p in big.prunes} == {p.setting for p in plain.prunes}
    assert [k.setting for k in big.spared] == [k.setting for k in plain.spared]
    kept = next(k for k in big.spared if k.setting == "close")
    assert kept.standard_error == pytest.approx(0.05e300)


def test_a_margin_is_asha_s_only_however_the_rule_is_made() -> None:
    with pytest.raises(ValueError, match="margin_se is asha's"):
        EarlyStop("val_accuracy", Mode.MAX, PruneRule.MEDIAN, min_steps=10, margin_se=1.0)
    with pytest.raises(ValueError, match="margin_se is asha's"):
        EarlyStop("val_accuracy", Mode.MAX, PruneRule.ASHA, min_steps=10, margin_se=-1.0)


def test_a_one_seed_setting_below_the_cutoff_has_no_spread_to_be_spared_by() -> None:
    wide = EarlyStop("val_accuracy", Mode.MAX, PruneRule.ASHA, min_steps=10, margin_se=10.0)
    finals = [0.5, 0.6, 0.9, 0.55, 0.65, 0.52, 0.58, 0.62, 0.51]  # 9 settings of one seed: cutoff the 3rd
    spared = {p.setting for p in judge(wide, _grid(finals, 10), []).prunes}
    assert spared == {p.setting for p in judge(ASHA, _grid(finals, 10), []).prunes} and spared
