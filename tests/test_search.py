"""`search:` in a suite: the spec's checks, random trials the same every time (a dry run shows
them), and a TPE search that ends with exactly `trials` trials across a daemon killed twice."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Orch, orch_env, requires_tmux, wait_until

from orchestrator.errors import PlanError
from orchestrator.lifecycle import JobState
from orchestrator.plans.search import Distribution, SearchMethod, parse_search
from orchestrator.plans.trial_sampling import FinishedTrial, TrialEnd, next_trial, random_trials

KNOWN = {"learning_rate", "lora_r", "warmup_ratio", "batch_size"}
SPACE = {
    "learning_rate": {"log_uniform": [1.0e-5, 1.0e-2]},
    "lora_r": [4, 8, 16],
    "warmup_ratio": {"uniform": [0.0, 0.1]},
}


def _search(**changes: Any) -> dict[str, Any]:
    return {
        "method": "tpe",
        "trials": 8,
        "seed": 0,
        "metric": "val_accuracy",
        "mode": "max",
        "space": SPACE,
        **changes,
    }


def test_a_search_is_parsed_with_its_space() -> None:
    search = parse_search("s", _search(), KNOWN, ())
    assert search.method is SearchMethod.TPE and search.trials == 8
    assert [d.distribution for d in search.space] == [
        Distribution.LOG_UNIFORM,
        Distribution.CHOICE,
        Distribution.UNIFORM,
    ]


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"method": "bayes"}, "unknown `search.method` 'bayes'"),
        ({"space": {"learning_rate": {"normal": [0, 1]}}}, "unknown distribution 'normal'"),
        ({"space": {"learning_rate": {"log_uniform": [0, 1]}}}, "log_uniform needs bounds above 0"),
        ({"space": {"learning_rate": {"uniform": [0.1, 0.1]}}}, "low 0.1 must be below high 0.1"),
        ({"trials": 100_001}, "between 1 and 100000 (the submit cap), not 100001"),
        ({"trials": "4"}, "(the submit cap), not '4'"),
        ({"trials": None}, "`search.trials` is required"),
        ({"space": {"nope": [1, 2]}}, "unknown config key 'nope'"),
        ({"space": {"learning_rat": [1, 2]}}, "unknown config key 'learning_rat' (did you mean 'learning_rate'?)"),
        ({"space": {"seed": [1, 2]}}, "seed and data come from the pairs"),
        ({"metric": None}, "`search.metric` is required for tpe"),
        ({"space": {}}, "`search.space` must map"),
    ],
)
def test_bad_searches_are_refused_in_one_line(changes: dict[str, Any], said: str) -> None:
    with pytest.raises(PlanError) as info:
        parse_search("suite s.yaml", _search(**changes), KNOWN, ())
    assert said in str(info.value) and "\n" not in str(info.value)


def test_a_seeded_random_search_draws_the_same_trials_every_time() -> None:
    search = parse_search("s", _search(method="random"), KNOWN, ())
    first = random_trials(search)
    assert first == random_trials(search) and len(first) == 8
    assert all(1e-5 <= t["learning_rate"] <= 1e-2 and t["lora_r"] in (4, 8, 16) for t in first)
    assert random_trials(parse_search("s", _search(method="random", seed=1), KNOWN, ())) != first


def test_tpe_asks_from_the_finished_trials() -> None:
    search = parse_search("s", _search(trials=30), KNOWN, ())
    told = [
        FinishedTrial(i, p, TrialEnd.COMPLETE, -abs(p["learning_rate"] - 1e-3))
        for i, p in enumerate(
            random_trials(parse_search("s", _search(method="random", trials=20), KNOWN, ()))
        )
    ]
    told.append(FinishedTrial(20, told[0].params, TrialEnd.PRUNED))
    asked = next_trial(search, told, 21)
    assert asked == next_trial(search, told, 21)  # the same finished trials ask the same trial
    assert set(asked) == {"learning_rate", "lora_r", "warmup_ratio"}


# -- end to end ---------------------------------------------------------------------------------


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path) as env:
        yield env


def _suite(orch: Orch, method: str, trials: int, **changes: Any) -> None:
    search = {
        "method": method,
        "trials": trials,
        "seed": 3,
        "metric": "val_accuracy",
        "mode": "max",
        "space": {"learning_rate": {"log_uniform": [1.0e-5, 1.0e-2]}},
        **changes,
    }
    orch.write_suite(
        "hp",
        {
            "base": {
                "sim_mem_gib": 1,
                "sim_seconds": 1.5,
                "sim_ramp_s": 0.1,
                "learning_rate": 1e-4,
                "sim_best_lr": 1e-4,
            }
        },
        mem_gib=1,
        search=search,
    )


@requires_tmux
def test_a_dry_run_shows_the_random_trials_the_same_every_time(orch: Orch) -> None:
    _suite(orch, "random", 5)
    shown = orch.run("submit", "--suite", "hp", "--pairs", "1:toy 2:toy", "--dry-run").stdout
    assert (
        shown == orch.run("submit", "--suite", "hp", "--pairs", "1:toy 2:toy", "--dry-run").stdout
    )
    assert shown.count("learning_rate=") == 10 and "would queue 10 job(s)" in shown
    assert all(shown.count(f"  trial {n}  ") == 2 for n in range(5))  # each trial named, once per pair
    orch.submit("hp", "1:toy 2:toy")
    jobs = orch.jobs()
    assert sorted(j.search["trial"] for j in jobs) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    first = min(jobs, key=lambda j: j.id)  # its drawn values are the search's, not a --set
    assert orch.json("show", str(first.id))["trial"] == first.search["trial"]
    said = orch.run("show", str(first.id)).stdout
    assert f"  search trial {first.search['trial']}: learning_rate=" in said and "--set" not in said
    assert {f"learning_rate={j.overrides['learning_rate']}" for j in jobs} <= set(shown.split())
    bad = orch.run(
        "submit",
        "--suite",
        "hp",
        "--pairs",
        "1:toy",
        "--grid",
        "learning_rate=0.1,0.2",
        check=False,
    )
    assert (
        bad.returncode == 2
        and "keep one" in bad.stderr
        and len(bad.stderr.strip().splitlines()) == 1
    )


@requires_tmux
def test_trials_of_a_search_without_a_metric_point_at_results(orch: Orch) -> None:
    search = {"method": "random", "trials": 2, "space": {"learning_rate": [1e-4, 1e-3]}}
    orch.write_suite("hp", {"base": {"sim_mem_gib": 1, "learning_rate": 1e-4}}, mem_gib=1, search=search)
    orch.submit("hp", "1:toy")
    listed = orch.run("trials", "--suite", "hp", check=False)
    assert listed.returncode == 2 and len(listed.stderr.strip().splitlines()) == 1
    assert "names no metric: its trials have no order (`orch results --suite hp` shows each trial" in listed.stderr


@requires_tmux
def test_trials_say_when_no_trial_reported_the_search_metric(orch: Orch) -> None:
    search = {"method": "random", "trials": 2, "seed": 0, "metric": "val_f1", "mode": "max",
              "space": {"learning_rate": [1e-4, 1e-3]}}  # fmt: skip
    base = {"sim_mem_gib": 1, "sim_seconds": 1.0, "sim_ramp_s": 0.1, "learning_rate": 1e-4, "sim_best_lr": 1e-4}
    orch.write_suite("hp", {"base": base}, mem_gib=1, search=search)
    orch.submit("hp", "1:toy")
    orch.start_daemon()
    assert set(orch.wait_all_done(120).values()) == {"succeeded"}
    listed = orch.run("trials", "--suite", "hp").stdout
    assert "note: no trial that succeeded reported 'val_f1', so none is ranked (reported: " in listed
    assert "val_accuracy" in listed.split("(reported: ")[1] and "best:" not in listed
    assert orch.json("trials", "--suite", "hp")["note"].startswith("no trial that succeeded reported 'val_f1'")


@requires_tmux
def test_a_tpe_search_whose_metric_no_trial_reports_says_so_once(orch: Orch) -> None:
    search = {"method": "tpe", "trials": 3, "seed": 0, "metric": "val_f1", "mode": "max",
              "space": {"learning_rate": {"log_uniform": [1.0e-5, 1.0e-2]}}}  # fmt: skip
    base = {"sim_mem_gib": 1, "sim_seconds": 1.0, "sim_ramp_s": 0.1, "learning_rate": 1e-4, "sim_best_lr": 1e-4}
    orch.write_suite("hp", {"base": base}, mem_gib=1, search=search)
    orch.submit("hp", "1:toy")
    orch.start_daemon()
    wait_until(lambda: len(orch.jobs()) == 3 or None, 120, "the search's three trials")
    assert set(orch.wait_all_done(120).values()) == {"succeeded"}
    said = [e.message for e in orch.events("search")]
    assert len(said) == 1, said  # once, not at every trial asked
    assert said[0].startswith("the search of suite hp: trial 0 succeeded without reporting 'val_f1' (reported: ")
    assert "TPE is told it failed" in said[0]


@requires_tmux
def test_a_random_search_over_fewer_settings_than_trials_queues_each_once_and_says_so(orch: Orch) -> None:
    search = {"method": "random", "trials": 5, "seed": 0, "space": {"learning_rate": [1e-4, 1e-3]}}
    orch.write_suite("hp", {"base": {"sim_mem_gib": 1, "learning_rate": 1e-4}}, mem_gib=1, search=search)
    done = orch.run("submit", "--suite", "hp", "--pairs", "1:toy")
    assert "note: random search: 2 trials, not 5: its space has no other setting" in done.stderr
    assert "already present" not in done.stdout + done.stderr
    assert sorted(j.overrides["learning_rate"] for j in orch.jobs()) == [1e-4, 1e-3]


@requires_tmux
def test_a_tpe_dry_run_says_trial_0_would_be_queued(orch: Orch) -> None:
    _suite(orch, "tpe", 3)
    dry = orch.run("submit", "--suite", "hp", "--pairs", "1:toy", "--dry-run")
    assert "note: tpe search: trial 0 would be queued now (a dry run queues nothing)" in dry.stderr
    assert "would queue 1 job(s)" in dry.stdout and not orch.db.exists()
    done = orch.run("submit", "--suite", "hp", "--pairs", "1:toy")
    assert "note: tpe search: trial 0 is queued now; the daemon asks for trials 1 to 2" in done.stderr


@requires_tmux
def test_a_tpe_search_submitted_again_says_what_it_does_and_takes_its_new_trials(orch: Orch) -> None:
    """Submitted again unchanged, a TPE search queues nothing and says so (it used to say trial 0
    was queued); with more trials it is the same search, extended: its stored trials follow."""
    _suite(orch, "tpe", 3)
    orch.submit("hp", "1:toy")
    again = orch.run("submit", "--suite", "hp", "--pairs", "1:toy")
    assert "note: tpe search: already submitted (1 of 3 trials asked so far): no new trial is queued" in again.stderr
    assert "trial 0 is queued now" not in again.stderr
    _suite(orch, "tpe", 5)
    dry = orch.run("submit", "--suite", "hp", "--pairs", "1:toy", "--dry-run")
    assert "now 5, the daemon would ask for trials 1 to 4" in dry.stderr
    assert {j.search["spec"]["trials"] for j in orch.jobs()} == {3}  # a dry run writes nothing
    more = orch.run("submit", "--suite", "hp", "--pairs", "1:toy")
    assert "submitted before with 3 trials (1 asked so far): now 5, the daemon asks for trials 1 to 4" in more.stderr
    assert {j.search["spec"]["trials"] for j in orch.jobs()} == {5}
    paired = orch.run("submit", "--suite", "hp", "--pairs", "1:toy 2:toy")  # a new pair: its trial 0 only
    assert "trial 0 of the new pairs is queued (1 job(s), or again with --force)" in paired.stderr
    assert "already submitted (1 of 5 trials asked so far)" in paired.stderr
    assert sorted((j.seed, j.search["trial"]) for j in orch.jobs()) == [(1, 0), (2, 0)]


@requires_tmux
def test_a_changed_search_submitted_to_the_same_suite_is_refused_with_nothing_written(orch: Orch) -> None:
    """A second search in one suite numbered its trials from 0 again, and `orch trials` pooled
    its trial 1 with the first search's (two learning rates as one trial's seeds)."""
    _suite(orch, "random", 3)
    orch.submit("hp", "1:toy")
    before = [(j.id, j.config["learning_rate"]) for j in orch.jobs()]
    for method, changes, said in [
        ("random", {"seed": 4}, "differs in its seed"),
        ("random", {"space": {"learning_rate": {"log_uniform": [1.0e-3, 1.0e-2]}}}, "differs in its space"),
        ("tpe", {}, "differs in its method"),
    ]:
        _suite(orch, method, 3, **changes)
        refused = orch.run("submit", "--suite", "hp", "--pairs", "1:toy", check=False)
        assert refused.returncode == 2, refused.stderr
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith("orch: error: suite hp already holds a random search, and this one " + said), line
        assert "a suite of its own" in line
        assert [(j.id, j.config["learning_rate"]) for j in orch.jobs()] == before
    _suite(orch, "random", 4)  # `trials` alone: the same search, extended
    more = orch.run("submit", "--suite", "hp", "--pairs", "1:toy")
    assert [(j.id, j.config["learning_rate"]) for j in orch.jobs()][:3] == before and len(orch.jobs()) == 4, more


@requires_tmux
def test_a_search_is_the_same_one_whatever_its_numbers_text(orch: Orch) -> None:
    """A search is compared as read back: an integer bound stored as 8.0 by an older version is the
    same search (its new `trials` taken), a choice of 1.0 where it was 1 is another (refused)."""
    import sqlite3

    _suite(orch, "tpe", 3, space={"batch_size": {"int_uniform": [1, 8]}})
    orch.submit("hp", "1:toy")
    with sqlite3.connect(orch.db) as db:  # as an older version stored it
        db.execute("UPDATE jobs SET search_json = replace(search_json, '[1, 8]', '[1.0, 8.0]')")
        assert db.execute("SELECT count(*) FROM jobs WHERE search_json LIKE '%[1.0, 8.0]%'").fetchone()[0] == 1
    _suite(orch, "tpe", 5, space={"batch_size": {"int_uniform": [1, 8]}})
    more = orch.run("submit", "--suite", "hp", "--pairs", "1:toy")
    assert "submitted before with 3 trials (1 asked so far): now 5" in more.stderr, more.stderr
    assert {j.search["spec"]["trials"] for j in orch.jobs()} == {5}
    _suite(orch, "random", 2, space={"learning_rate": [1, 2]}, seed=9)
    refused = orch.run("submit", "--suite", "hp", "--pairs", "2:toy", check=False)
    assert refused.returncode == 2 and "already holds a tpe search" in refused.stderr


def test_search_specs_compare_as_read_back_with_numbers_kept_apart() -> None:
    from orchestrator.store.search import _spec_key

    spec = {"method": "random", "trials": 3, "seed": 0, "metric": None, "mode": "max"}
    ints = {**spec, "space": [{"key": "lora_r", "choice": [1, 2]}]}
    assert _spec_key(ints) == _spec_key({**ints, "trials": 7})
    assert _spec_key(ints) != _spec_key({**spec, "space": [{"key": "lora_r", "choice": [1.0, 2.0]}]})
    assert _spec_key(ints) != _spec_key({**spec, "space": [{"key": "lora_r", "choice": [True, 2]}]})
    old = {**spec, "space": [{"key": "batch_size", "int_uniform": [1.0, 8.0]}]}
    assert _spec_key(old) == _spec_key({**spec, "space": [{"key": "batch_size", "int_uniform": [1, 8]}]})


def test_nearby_tpe_seeds_share_no_start_up_trials_and_random_trials_never_repeat() -> None:
    """Trial n of a TPE search seeded s was the first trial of seed s + n (its sampler was seeded
    s + n); and a random search over few settings queued repeats, which collapsed into one job."""
    searches = [parse_search("s", _search(seed=seed), KNOWN, ()) for seed in (0, 1, 2)]
    firsts = [[next_trial(search, [], n) for n in range(4)] for search in searches]
    assert not any(a == b for i, x in enumerate(firsts) for y in firsts[i + 1:] for a in x for b in y)
    few = parse_search("s", _search(method="random", trials=5, space={"lora_r": [4, 8, 16]}), KNOWN, ())
    drawn = random_trials(few)
    assert sorted(t["lora_r"] for t in drawn) == [4, 8, 16]


@requires_tmux
@pytest.mark.tmux
@pytest.mark.slow
def test_a_tpe_search_killed_midway_ends_with_exactly_its_trials(orch: Orch) -> None:
    trials = 7
    _suite(orch, "tpe", trials)
    orch.submit("hp", "1:toy 2:toy", "--gpu-plan", "2,2")
    assert len(orch.jobs()) == 2  # trial 0 only: the daemon asks for the rest

    def numbers() -> set[int]:
        return {int(j.search["trial"]) for j in orch.jobs()}

    pid = orch.start_daemon()
    wait_until(lambda: len(numbers()) >= 3, 90, "three trials")
    os.kill(pid, signal.SIGKILL)  # in the middle of the search
    wait_until(lambda: orch.daemon_pid() is None or None, 30, "the daemon to be gone")
    orch.start_daemon_dying_at("after_trial_queued")  # dies again right after queueing one
    orch.start_daemon()
    wait_until(lambda: len(numbers()) == trials and orch.all_done(), 180, "every trial to end")
    jobs = orch.jobs()
    assert numbers() == set(range(trials))
    per_trial = Counter(int(j.search["trial"]) for j in jobs)
    assert set(per_trial.values()) == {2}  # every seed of every trial, once
    assert len({j.identity for j in jobs}) == len(jobs) == 2 * trials
    assert {j.state for j in jobs} == {JobState.SUCCEEDED}
    lrs = {j.overrides["learning_rate"] for j in jobs}
    assert len(lrs) == trials and all(1e-5 <= lr <= 1e-2 for lr in lrs)
    # the search's table: every trial, best first by its metric, the best named
    listed = orch.json("trials", "--suite", "hp")["trials"]
    assert [t["trial"] for t in listed] != [] and len(listed) == trials
    values = [t["value"] for t in listed]
    assert values == sorted(values, reverse=True) and all(t["counted"] == 2 for t in listed)
    shown = orch.run("trials", "--suite", "hp").stdout
    assert f"best: trial {listed[0]['trial']} (learning_rate=" in shown
    # the web page: the same table, and the final metric against the searched key
    from starlette.testclient import TestClient

    from orchestrator.web.app import create_app

    with TestClient(create_app(orch.db, "t0ken"), base_url="http://127.0.0.1:8765") as client:
        page = client.get("/trials")
    assert page.status_code == 200 and 'class="trials-plot"' in page.text
    assert page.text.count("<circle") == trials and page.text.count('class="trial"') == trials
    assert (
        f"best: trial {listed[0]['trial']} (learning_rate=" in page.text
        and "learning_rate (log)" in page.text
    )


def test_trials_are_listed_best_first_with_what_became_of_each_seed() -> None:
    from orchestrator.results.trials import trial_rows
    from orchestrator.store.rows import Job

    spec = {
        "method": "random",
        "metric": "val_accuracy",
        "space": [{"key": "learning_rate", "log_uniform": [1, 2]}],
    }

    def job(job_id: int, trial: int, state: JobState) -> Job:
        base: dict[str, Any] = dict(
            id=job_id,
            identity=str(job_id),
            suite="s",
            config_name="c",
            config_path="p",
            config_json="{}",
            seed=job_id,
            data="t",
            worker="w",
            declared_mib=1,
            priority=0,
            state=state,
            level=0,
            attempt_count=1,
            max_attempts=3,
            one_token=False,
            hang_timeout_s=60.0,
            queued_at=0.0,
            created_at=0.0,
            updated_at=0.0,
            crash_loop_failures=3,
            crash_loop_within_s=30.0,
            crash_loop_window_s=300.0,
            gpus=1,
        )
        return Job(
            **base,
            overrides={"learning_rate": 1.0 + trial / 10},
            search={"spec": spec, "trial": trial},
        )

    S, P, F = JobState.SUCCEEDED, JobState.PRUNED, JobState.FAILED
    jobs = [
        job(1, 0, S),
        job(2, 0, S),
        job(3, 1, S),
        job(4, 1, F),
        job(5, 2, P),
        job(6, 2, P),
        job(7, 3, S),
        job(8, 3, S),
    ]
    values = {1: 0.7, 2: 0.8, 3: 0.9, 7: 0.6, 8: 0.6, 5: 0.2}
    rows = trial_rows(jobs, values, "max")
    assert [r.trial for r in rows] == [1, 0, 3, 2]
    assert rows[0].n_text() == "1 of 2 (1 failed)" and rows[1].value == pytest.approx(0.75)
    assert rows[-1].value is None and rows[-1].n_text() == "0 of 2 (2 pruned)"
    assert [r.trial for r in trial_rows(jobs, values, "min")][:3] == [3, 0, 1]
    # a trial 1 of other values (a `--set` changed between submits): a row of its own, not pooled
    other = dataclasses.replace(job(9, 1, S), overrides={"learning_rate": 9.0})
    apart = trial_rows([*jobs, other], {**values, 9: 0.1}, "max")
    assert [(r.trial, r.params["learning_rate"], r.value) for r in apart if r.trial == 1] == [
        (1, 1.1, pytest.approx(0.9)), (1, 9.0, pytest.approx(0.1))]


def test_the_trials_plot_escapes_what_user_code_named() -> None:
    from orchestrator.results.trials import TrialRow
    from orchestrator.web.trials_plot import key_plots

    rows = [
        TrialRow(0, {"<k>": "<script>", "lr": 0.01}, 0.9, 1, 1, {"succeeded": 1}),
        TrialRow(1, {"<k>": "b", "lr": 0.001}, 0.5, 1, 1, {"succeeded": 1}),
        TrialRow(2, {"<k>": "c", "lr": 0.1}, None, 0, 1, {"pruned": 1}),
    ]
    plots = key_plots(rows, ["<k>", "lr"], {"lr"}, "val<acc>")
    assert [p.key for p in plots] == ["<k>", "lr"]
    text = "".join(str(p.svg) for p in plots)
    assert "<script>" not in text and "&lt;script&gt;" in text and text.count("<circle") == 4
    assert 'fill="#3b7dd8"' in str(plots[1].svg)  # the best trial filled


def test_a_bound_yaml_reads_as_text_is_taken_as_the_number_it_is() -> None:
    import yaml

    raw = yaml.safe_load("space: {learning_rate: {log_uniform: [1e-5, 1e-2]}}")
    assert raw["space"]["learning_rate"]["log_uniform"] == [
        "1e-5",
        "1e-2",
    ]  # YAML 1.1: no dot, no float
    search = parse_search("s", _search(space=raw["space"]), KNOWN, ())
    assert (search.space[0].low, search.space[0].high) == (1e-5, 1e-2)
    with pytest.raises(PlanError, match="two finite numbers"):
        parse_search("s", _search(space={"learning_rate": {"uniform": ["low", 1]}}), KNOWN, ())


def test_an_integer_search_reads_back_from_the_store_and_asks_again() -> None:
    """A stored TPE search over an int_uniform key is read back every time the daemon asks (its
    bounds stay integers; a search stored with `[2.0, 8.0]` reads as well)."""
    from orchestrator.plans.search import Search

    search = parse_search("s", _search(space={"batch_size": {"int_uniform": [2, 8]}}), KNOWN, ())
    stored = search.to_json()
    assert stored["space"] == [{"key": "batch_size", "int_uniform": [2, 8]}]
    assert Search.from_json(stored) == search
    older = {**stored, "space": [{"key": "batch_size", "int_uniform": [2.0, 8.0]}]}
    assert Search.from_json(older) == search
    told = [FinishedTrial(0, {"batch_size": 4}, TrialEnd.COMPLETE, 0.5)]
    asked = next_trial(Search.from_json(stored), told, 1)
    assert isinstance(asked["batch_size"], int) and 2 <= asked["batch_size"] <= 8


def test_a_search_that_cannot_ask_says_so_in_one_event(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.daemon import search as runner
    from orchestrator.store.db import Store
    from orchestrator.store.status import recent_events

    class Stored:
        suite, search = "hp", {"spec": {"method": "tpe"}}

    def broken(self: Any, key: Any, jobs: Any) -> None:
        raise PlanError("stored search: it cannot be read")

    monkeypatch.setattr(runner, "tpe_search_jobs", lambda store: [Stored()])
    monkeypatch.setattr(runner.SearchRunner, "_advance", broken)
    with Store(tmp_path / "state.db") as store:
        searches = runner.SearchRunner(store)
        for _ in range(3):
            searches._next_check_s = 0.0
            searches.check()
        said = [e.message for e in recent_events(store, 20) if e.kind == "search"]
    assert said == ["the search of suite hp cannot ask for its next trial (tried again every pass): "
                    "PlanError: stored search: it cannot be read"]  # once, however often it fails


@requires_tmux
def test_trials_times_pairs_above_the_cap_are_refused_before_any_trial_is_drawn(orch: Orch) -> None:
    search = {"method": "random", "trials": 60_000, "seed": 0, "space": {"learning_rate": {"uniform": [0.1, 0.2]}}}
    orch.write_suite("hp", {"base": {"sim_mem_gib": 1, "learning_rate": 1e-4}}, mem_gib=1, search=search)
    refused = orch.run("submit", "--suite", "hp", "--pairs", "1:toy 2:toy", "--dry-run", check=False)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "60000 trials × 1 configs × 2 pairs is more than 100000 jobs" in refused.stderr  # not "grid values"
