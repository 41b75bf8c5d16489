"""Early stopping end to end: a real daemon, tmux and simulated GPUs; the sim worker's
validation curve depends on its learning rate (`sim_best_lr`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Orch, orch_env, requires_tmux, wait_until

from orchestrator.api import Sweep
from orchestrator.lifecycle import AttemptOutcome, JobState
from orchestrator.store.early_stop import reached_steps

pytestmark = [requires_tmux, pytest.mark.tmux]

BEST_LR = 1e-4
GRID = "learning_rate=0.01,0.003,0.0001,0.001,0.03,0.1"
STEPS = 80  # sim_seconds 20 / 0.25 s a step


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path, gpus="2x24GiB") as env:
        yield env


def _suite(orch: Orch, **early_stop: object) -> None:
    rule = {
        "metric": "val_accuracy",
        "mode": "max",
        "rule": "asha",
        "min_steps": 4,
        "reduction_factor": 3,
        **early_stop,
    }
    orch.write_suite(
        "es",
        {
            "base": {
                "sim_mem_gib": 1,
                "sim_seconds": STEPS / 4,
                "sim_ramp_s": 0.2,
                "learning_rate": BEST_LR,
                "sim_best_lr": BEST_LR,
            }
        },
        mem_gib=1,
        hang_timeout_s=8,
        early_stop=rule,
    )


@pytest.mark.slow
def test_a_grid_with_one_clear_best_runs_at_most_half_its_steps(orch: Orch) -> None:
    _suite(orch)
    orch.submit("es", "1:toy 2:toy", "--grid", GRID, "--gpu-plan", "6,6")
    orch.start_daemon()
    states = wait_until(lambda: orch.all_done() and orch.job_states(), 150, "every job to end")
    jobs = orch.jobs()
    assert len(jobs) == 12
    best = [j for j in jobs if j.config["learning_rate"] == BEST_LR]
    assert [j.state for j in best] == [
        JobState.SUCCEEDED,
        JobState.SUCCEEDED,
    ]  # runs to its end on every seed
    pruned = [j for j in jobs if j.state is JobState.PRUNED]
    assert len(pruned) >= 4
    # stopping a setting stops all of its seeds
    assert {j.config["learning_rate"] for j in pruned}.isdisjoint(
        {j.config["learning_rate"] for j in jobs if j.state is JobState.SUCCEEDED}
    )
    steps = orch.read(lambda store: reached_steps(store, [j.id for j in jobs]))
    assert steps[best[0].id] == STEPS
    assert sum(steps.values()) <= len(jobs) * STEPS / 2, steps
    # never retried: one attempt each, ended pruned, the reason said with the step
    for job in pruned:
        (attempt,) = orch.attempt_rows(job.id)
        assert attempt.outcome is AttemptOutcome.PRUNED
        assert job.reason is not None and job.reason.startswith("pruned at step ")
        assert job.pruned["metric"] == "val_accuracy" and job.pruned["of"] >= job.pruned["rank"] > 1
    assert orch.events("prune")
    shown = orch.run("show", str(pruned[0].id)).stdout
    assert "pruned at step" in shown
    assert set(states.values()) <= {"succeeded", "pruned"}
    # six pruned attempts of one config, each within 30 s of its start: failures would have paused it
    assert not orch.events("pause")

    # results: pruned runs out of every mean, counted, marked; the API carries them
    table = orch.run("results", "--suite", "es").stdout
    assert "0 of 2 (2 pruned)" in table and "‡" in table and "pruned at step" in table
    rows = Sweep(orch.db).results(as_frame=False)
    assert {r["job"] for r in rows if r["state"] == "pruned"} == {j.id for j in pruned}
    assert all(
        r["value"] is None
        and not r["counted"]
        and r["why"].startswith("pruned at step")
        and "‡" in r["marks"]
        for r in rows
        if r["state"] == "pruned"
    ), [(r["why"], r["marks"]) for r in rows if r["state"] == "pruned"]

    # the suite submitted again unchanged queues nothing: a pruned job is there already (queued
    # again it would run the steps early stopping saved)
    again = orch.run("submit", "--suite", "es", "--pairs", "1:toy 2:toy", "--grid", GRID).stdout
    assert again.startswith("queued 0 job(s) of suite es; 12 already present (pruned, succeeded;"), again
    assert "`orch retry JOB` resumes a pruned one" in again and len(orch.jobs()) == 12

    # `orch retry` resumes a pruned job; its setting is judged no more
    retried = pruned[0]
    orch.run("retry", str(retried.id))
    wait_until(
        lambda: orch.jobs()[retried.id - 1].state is JobState.SUCCEEDED,
        60,
        "the retried job to succeed",
    )
    assert len(orch.attempt_rows(retried.id)) == 2

    # a new seed of a stopped setting ends pruned too (stopping a setting stops all of its seeds), in
    # the transaction that queues it: never started (it used to start, then be stopped a second later)
    dry = orch.run("submit", "--suite", "es", "--pairs", "3:toy", "--grid", GRID, "--dry-run")
    assert "note: 5 of the jobs queued would end pruned at once, never started" in dry.stderr
    assert dry.stdout.count("(would end pruned at once)") == 5  # each such job's line says it
    added = orch.json("submit", "--suite", "es", "--pairs", "3:toy", "--grid", GRID)
    stopped = {j.config["learning_rate"] for j in pruned}
    assert sorted(j["state"] for j in added["jobs"]) == ["pruned"] * 5 + ["queued"]

    def new_seeds() -> list[Any]:
        return [j for j in orch.jobs() if j.id > 12 and j.config["learning_rate"] in stopped]

    assert len(new_seeds()) == len(stopped) == 5
    assert all(j.state is JobState.PRUNED and not orch.attempt_rows(j.id) for j in new_seeds())
    assert all("before this job was queued" in (j.reason or "") for j in new_seeds())
    records = {json.dumps(j.pruned, sort_keys=True) for j in pruned}
    assert all(json.dumps(j.pruned, sort_keys=True) in records for j in new_seeds())  # its setting's stop
    assert all(j.reason is not None and j.reason.startswith("pruned at step ") for j in new_seeds())


@pytest.mark.slow
def test_a_metric_never_reported_stops_nothing_and_warns(orch: Orch) -> None:
    _suite(orch, metric="val_f1")
    orch.submit("es", "1:toy", "--grid", "learning_rate=0.01,0.0001,0.1", "--gpu-plan", "6,6")
    orch.start_daemon()
    wait_until(lambda: orch.all_done(), 90, "every job to end")
    assert {j.state for j in orch.jobs()} == {JobState.SUCCEEDED}
    warnings = [e for e in orch.events("early_stop") if "val_f1" in e.message]
    assert len(warnings) == 1 and "nothing is stopped" in warnings[0].message
    assert "reported: " in warnings[0].message and "val_accuracy" in warnings[0].message  # what it may mean
    # the results table says it too: the event alone scrolls out of `orch status` within minutes
    shown = orch.run("results", "--suite", "es")
    assert "early stopping: es on toy: early_stop metric 'val_f1' was never reported, so nothing was stopped " \
        "(reported: " in shown.stderr and "val_accuracy" in shown.stderr


@pytest.mark.slow
def test_a_random_search_with_early_stopping_prunes_trials_and_lists_them(orch: Orch) -> None:
    search = {
        "method": "random",
        "trials": 6,
        "seed": 5,
        "metric": "val_accuracy",
        "mode": "max",
        "space": {"learning_rate": {"log_uniform": [1.0e-6, 1.0e-1]}},
    }
    _suite(orch, value="best")  # each seed judged on its best so far (a rising curve: its last)
    suite_file = orch.plans / "suites" / "es.yaml"
    suite_file.write_text(suite_file.read_text() + "search: " + json.dumps(search) + "\n")
    orch.submit("es", "1:toy", "--gpu-plan", "6,6")
    orch.start_daemon()
    wait_until(lambda: orch.all_done(), 150, "every trial to end")
    jobs = orch.jobs()
    assert len(jobs) == 6 and {j.state for j in jobs} <= {JobState.SUCCEEDED, JobState.PRUNED}
    assert any(j.state is JobState.PRUNED for j in jobs)
    listed = orch.json("trials", "--suite", "es")["trials"]
    assert len(listed) == 6
    pruned = [t for t in listed if t["states"].get("pruned")]
    assert (
        pruned and all(t["value"] is None for t in pruned) and listed[-1] in pruned
    )  # no value: listed last
    best = max(jobs, key=lambda j: -abs(math.log10(j.overrides["learning_rate"] / BEST_LR)))
    assert best.state is JobState.SUCCEEDED  # the trial nearest the best rate runs to its end
    stopped = [j for j in jobs if j.state is JobState.PRUNED]
    said = "(the setting's mean of each seed's best so far)"
    assert all(j.pruned["seed_value"] == "best" and said in (j.reason or "") for j in stopped)


def test_a_margin_is_stored_with_each_job_and_read_back_as_the_daemon_reads_it(orch: Orch) -> None:
    from orchestrator.plans.early_stop import EarlyStop

    _suite(orch, margin_se=1)
    orch.submit("es", "1:toy 2:toy", "--grid", "learning_rate=0.01,0.001")
    jobs = orch.jobs()
    assert len(jobs) == 4
    rules = {json.dumps(job.early_stop, sort_keys=True) for job in jobs}
    assert len(rules) == 1 and '"margin_se": 1.0' in next(iter(rules))
    spec = EarlyStop.from_json(jobs[0].early_stop)
    assert spec is not None and spec.margin_se == 1.0
    # the rule is said where a user looks: at submit (a dry run too) and in `orch show`
    said = "early_stop: metric val_accuracy, mode max, rule asha, min_steps 4, reduction_factor 3, margin_se 1"
    dry = orch.run("submit", "--suite", "es", "--pairs", "3:toy", "--dry-run").stdout
    assert said in dry.splitlines()
    assert said in orch.run("show", str(jobs[0].id)).stdout
    shown = json.loads(orch.run("show", str(jobs[0].id), "--json").stdout)
    assert shown["early_stop"]["margin_se"] == 1.0


def test_a_changed_rule_submitted_again_is_said_not_dropped_without_a_word(orch: Orch) -> None:
    _suite(orch)
    orch.submit("es", "1:toy", "--grid", "learning_rate=0.01,0.001")
    _suite(orch, min_steps=8)
    again = orch.run("submit", "--suite", "es", "--pairs", "1:toy", "--grid", "learning_rate=0.01,0.001")
    said = "note: early_stop differs from the rule this suite's jobs were queued with (min_steps 4 → 8)"
    assert f"{said}: no job is queued with it, so nothing changes" in again.stderr
    assert {j.early_stop["min_steps"] for j in orch.jobs()} == {4}
    dry = orch.run("submit", "--suite", "es", "--pairs", "2:toy", "--grid", "learning_rate=0.01,0.001", "--dry-run")
    assert f"{said}: the jobs this would queue hold it" in dry.stderr
    added = orch.run("submit", "--suite", "es", "--pairs", "2:toy", "--grid", "learning_rate=0.01,0.001")
    assert f"{said}: the jobs queued now hold it" in added.stderr
    assert sorted(j.early_stop["min_steps"] for j in orch.jobs()) == [4, 4, 8, 8]
    quiet = orch.run("submit", "--suite", "es", "--pairs", "2:toy", "--grid", "learning_rate=0.01,0.001")
    assert "early_stop differs" not in quiet.stderr  # the newest jobs hold the file's rule now
    suite_file = orch.plans / "suites" / "es.yaml"
    suite_file.write_text("\n".join(line for line in suite_file.read_text().splitlines()
                                    if not line.startswith(("early_stop", "  "))) + "\n")
    dropped = orch.run("submit", "--suite", "es", "--pairs", "2:toy", "--grid", "learning_rate=0.01,0.001")
    assert "note: the suite file has no early_stop:, but its jobs were queued with one (metric val_accuracy" \
        in dropped.stderr and "they are still judged by it; the jobs queued now are not judged" in dropped.stderr


def test_a_changed_rule_of_a_tpe_search_is_said_to_go_unused() -> None:
    from orchestrator.plans.model import JobSpec
    from orchestrator.store.jobs import SubmitOutcome
    from orchestrator.submit.core import changed_rule_note

    spec = JobSpec("s", "c", "c.yaml", {}, 1, "toy", {}, {}, "x")
    held = {"toy": {"metric": "loss", "min_steps": 10}, "other": {"metric": "loss", "min_steps": 99}}
    rule = {"metric": "loss", "min_steps": 20}
    existing = [SubmitOutcome(spec, 1, False, "succeeded")]
    note = changed_rule_note(held, rule, existing, tpe=True)
    assert note == ("note: early_stop differs from the rule this suite's jobs were queued with (min_steps 10 → 20): "
                    "not used: a tpe search's later trials copy its trial 0's rule")
    assert changed_rule_note({"other": held["other"]}, rule, existing, tpe=True) is None  # another task's rule
    assert changed_rule_note({"toy": rule}, rule, existing, tpe=True) is None
