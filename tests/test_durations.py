"""Expected run times learned from succeeded attempts."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_helpers import declared_plan

from orchestrator.plans import expand_jobs, load_suite, parse_pairs
from orchestrator.prediction.durations import CompletedRun, DurationTable, expected_duration_s
from orchestrator.scheduling.dispatch import load_durations
from orchestrator.store import Store
from orchestrator.store.attempts import start_attempt, update_attempt
from orchestrator.store.jobs import submit_jobs
from tests.store_reads import read_jobs

PLANS = Path(__file__).resolve().parent.parent / "plans"


def run(config: str, task: str, duration_s: float, level: int = 0) -> CompletedRun:
    return CompletedRun(config, task, level, duration_s)


def test_nothing_of_the_task_completed_gives_no_estimate() -> None:
    assert expected_duration_s([], "a", "qqp", 0) is None
    assert expected_duration_s([run("a", "rte", 60.0)], "a", "qqp", 0) is None


def test_the_exact_shape_is_its_own_mean() -> None:
    history = [run("a", "rte", 60.0), run("a", "rte", 100.0), run("a", "rte", 500.0, level=1)]
    assert expected_duration_s(history, "a", "rte", 0) == pytest.approx(80.0)
    assert expected_duration_s(history, "a", "rte", 1) == pytest.approx(500.0)
    # another level of the same config and task: the mean over its levels
    assert expected_duration_s(history, "a", "rte", 2) == pytest.approx(220.0)


def test_an_unseen_config_scales_the_task_mean_by_how_fast_that_config_is_elsewhere() -> None:
    # big ran rte at 1.6 × the task's mean (250 s); it has no sst2 run yet, so sst2's mean is
    # scaled by big's factor (the geometric mean of its ratios to its tasks' means)
    history = [
        run("small", "rte", 100.0),
        run("big", "rte", 400.0),
        run("small", "sst2", 1000.0),
    ]
    table = DurationTable(history)
    rte_mean = 250.0
    assert table.expected_s("big", "sst2", 0) == pytest.approx(1000.0 * 400.0 / rte_mean)
    assert table.expected_s("small", "sst2", 0) == pytest.approx(1000.0)
    # a config never seen at all gets the task's mean
    assert table.expected_s("new", "sst2", 0) == pytest.approx(1000.0)


def test_zero_length_runs_are_ignored() -> None:
    assert expected_duration_s([run("a", "rte", 0.0)], "a", "rte", 0) is None


def test_the_daemon_reads_succeeded_attempts_from_its_store(db_path: Path) -> None:
    with Store(db_path) as store:
        suite = load_suite("demo", PLANS)
        specs = expand_jobs(suite, parse_pairs("87:glue_rte"), {}, None, 0)
        submit_jobs(store, suite, specs, allowed_gpus=None, priority=0, force=False, dry_run=False)
        jobs = read_jobs(store)
        ran = {  # job id -> (outcome, wall seconds)
            jobs[0].id: ("succeeded", 120.0),
            jobs[1].id: ("oom", 5.0),  # an OOM says nothing about how long the job takes
        }
        for job_id, (outcome, wall_s) in ran.items():
            plan = declared_plan(job_id)
            attempt = start_attempt(store, plan, lambda n, j=job_id: db_path.parent / f"run-{j}-{n}")
            update_attempt(
                store, attempt.id, outcome=outcome, ended_at=attempt.started_at + wall_s
            )
        table = load_durations(store)
    first, second = jobs[0], jobs[1]
    assert table.expected_s(first.config_name, first.data, 0) == pytest.approx(120.0)
    # the OOM'd job's config has no success: it gets its task's mean, scaled by nothing
    assert second.data == first.data
    assert table.expected_s(second.config_name, "glue_rte", 0) == pytest.approx(120.0)
    assert table.expected_s(first.config_name, "glue_mrpc", 0) is None
