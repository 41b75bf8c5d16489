"""The crash-loop guard: a suite's `crash_loop` setting travels with its jobs into state.db and
decides when fast non-OOM failures pause a config; the suite pauses once every config of it is
paused, and `orch status` says what is paused and why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.attempts.crash_loop import crash_loop_of, crash_loop_reason, guard_crash_loop
from orchestrator.plans import CRASH_LOOP_OFF, CrashLoop, expand_jobs, load_suite, parse_pairs
from orchestrator.store import Store
from orchestrator.store.db import now_s
from orchestrator.store.jobs import submit_jobs
from orchestrator.store.queries import get_job
from orchestrator.store.rows import Job
from orchestrator.store.status import paused_configs, paused_suites
from tests.conftest import OrchRunner
from tests.store_helpers import old_database_with_one_job
from tests.store_reads import events, job_ids


def write_suite(plans: Path, name: str, configs: tuple[str, ...] = ("a",), **settings: Any) -> Path:
    (plans / "suites").mkdir(parents=True, exist_ok=True)
    (plans / "configs" / name).mkdir(parents=True, exist_ok=True)
    for config in configs:
        (plans / "configs" / name / f"{config}.yaml").write_text(yaml.safe_dump({"sim_mem_gib": 1}))
    body = {"worker": "sim", "mem_gib": 1, "configs": list(configs), **settings}
    (plans / "suites" / f"{name}.yaml").write_text(yaml.safe_dump(body))
    return plans


def submit(store: Store, plans: Path, name: str, n_jobs: int) -> list[Job]:
    suite = load_suite(name, plans)
    pairs = parse_pairs(" ".join(f"{seed}:task" for seed in range(1, n_jobs + 1)))
    submit_jobs(store, suite, expand_jobs(suite, pairs, {}, None, 0), allowed_gpus=None, priority=0,
                force=False, dry_run=False)
    return [get_job(store, job_id) for job_id in job_ids(store, suite=name)]


def add_failed_attempt(store: Store, job: Job, ran_s: float, ended_ago_s: float = 1.0,
                       reason: str = "exit 1", kill_requested: str | None = None) -> None:
    """An attempt that failed `ended_ago_s` ago after running `ran_s`."""
    ended_at = now_s() - ended_ago_s
    with store.write():
        store.execute(
            "INSERT INTO attempts (job_id, n, gpu_index, gpu_uuid, level, run_dir, predicted_peak_mib, "
            "prediction_source, reserved_mib, started_at, ended_at, outcome, reason, kill_requested) "
            "VALUES (?, (SELECT count(*) + 1 FROM attempts WHERE job_id = ?), 0, 'GPU-0', 0, 'run', 1024, "
            "'declared', 0, ?, ?, 'failed', ?, ?)",
            [job.id, job.id, ended_at - ran_s, ended_at, reason, kill_requested],
        )


def paused(store: Store) -> dict[str, str]:
    return {p.suite: p.reason for p in paused_suites(store)}


# ---------------------------------------------------------------- the decision


def test_default_guard_pauses_at_three_fast_failures() -> None:
    assert crash_loop_reason([1.0, 2.0], CrashLoop()) is None
    assert crash_loop_reason([1.0, 2.0, 45.0], CrashLoop()) is None  # 45 s is not fast
    assert crash_loop_reason([1.0, 2.0, 29.9], CrashLoop()) == "3 attempts failed within 30 s each in the last 5 min"


def test_a_wall_clock_step_back_makes_no_crash_loop(db_path: Path, tmp_path: Path) -> None:
    # attempts that ran across a step back read as having run a negative time: not fast crashes
    assert crash_loop_reason([-3590.0, -1800.0, -0.5], CrashLoop()) is None
    plans = write_suite(tmp_path / "plans", "stepped")
    with Store(db_path) as store:
        jobs = submit(store, plans, "stepped", 3)
        for job in jobs:  # fast failures stamped an hour ahead: they ended before the clock went back
            add_failed_attempt(store, job, ran_s=1.0, ended_ago_s=-3600.0)
        guard_crash_loop(store, "stepped", "a", crash_loop_of(jobs[0]))
        assert paused(store) == {}
        for job in jobs:
            add_failed_attempt(store, job, ran_s=1.0)
        guard_crash_loop(store, "stepped", "a", crash_loop_of(jobs[0]))
        assert "3 attempts failed within 30 s" in paused(store)["stepped"]


def test_guard_follows_its_setting() -> None:
    assert crash_loop_reason([50.0], CrashLoop(failures=1, within_s=60, window_s=90)) == (
        "1 attempt failed within 60 s each in the last 90 s"
    )
    assert crash_loop_reason([1.0] * 4, CrashLoop(failures=5)) is None
    assert crash_loop_reason([1.0] * 1000, CRASH_LOOP_OFF) is None


# ---------------------------------------------------------------- the setting, through state.db


def test_suite_setting_is_stored_with_each_job(db_path: Path, tmp_path: Path) -> None:
    plans = write_suite(tmp_path / "plans", "tight", crash_loop={"failures": 2, "within_s": 5, "window_s": 60})
    write_suite(plans, "plain")
    write_suite(plans, "free", crash_loop=False)
    with Store(db_path) as store:
        assert crash_loop_of(submit(store, plans, "tight", 1)[0]) == CrashLoop(2, 5.0, 60.0)
        assert crash_loop_of(submit(store, plans, "plain", 1)[0]) == CrashLoop()
        assert crash_loop_of(submit(store, plans, "free", 1)[0]) == CRASH_LOOP_OFF


def test_guard_pauses_after_the_suites_count(db_path: Path, tmp_path: Path) -> None:
    plans = write_suite(tmp_path / "plans", "tight", crash_loop={"failures": 2, "within_s": 5, "window_s": 60})
    with Store(db_path) as store:
        jobs = submit(store, plans, "tight", 3)
        guard = crash_loop_of(jobs[0])
        add_failed_attempt(store, jobs[0], ran_s=1.0)
        add_failed_attempt(store, jobs[1], ran_s=8.0)  # slower than within_s: not counted
        add_failed_attempt(store, jobs[2], ran_s=1.0, ended_ago_s=120.0)  # outside the window
        add_failed_attempt(store, jobs[2], ran_s=1.0, reason="hung", kill_requested="hung")  # hangs have their own rule
        guard_crash_loop(store, "tight", "a", guard)
        assert paused(store) == {}
        add_failed_attempt(store, jobs[1], ran_s=4.0)
        guard_crash_loop(store, "tight", "a", guard)
        assert paused(store) == {"tight": "2 attempts failed within 5 s each in the last 60 s"}
        assert len(events(store, "pause")) == 1


def test_guard_switched_off_never_pauses(db_path: Path, tmp_path: Path) -> None:
    plans = write_suite(tmp_path / "plans", "free", crash_loop="off")
    with Store(db_path) as store:
        jobs = submit(store, plans, "free", 5)
        for job in jobs:
            add_failed_attempt(store, job, ran_s=0.5)
        guard_crash_loop(store, "free", "a", crash_loop_of(jobs[0]))
        assert paused(store) == {}
        guard_crash_loop(store, "free", "a", CrashLoop())  # the same history trips the default guard
        assert set(paused(store)) == {"free"}


def test_jobs_queued_before_the_setting_keep_the_old_guard(db_path: Path) -> None:
    # A state.db migrated up to just before the crash-loop columns, with a job in it.
    old_database_with_one_job(db_path, stop_before="m002_crash_loop")
    with Store(db_path) as store:
        assert crash_loop_of(get_job(store, job_ids(store)[0])) == CrashLoop(3, 30.0, 300.0)


@pytest.mark.parametrize("failures", [1, 4])
def test_guard_counts_every_job_of_the_suite(db_path: Path, tmp_path: Path, failures: int) -> None:
    plans = write_suite(tmp_path / "plans", "s", crash_loop={"failures": failures})
    write_suite(plans, "other")
    with Store(db_path) as store:
        jobs = submit(store, plans, "s", failures)
        other = submit(store, plans, "other", 3)
        for job in other:  # another suite's failures do not count against this one
            add_failed_attempt(store, job, ran_s=1.0)
        for job in jobs[:-1]:
            add_failed_attempt(store, job, ran_s=1.0)
        guard_crash_loop(store, "s", "a", crash_loop_of(jobs[0]))
        assert "s" not in paused(store)
        add_failed_attempt(store, jobs[-1], ran_s=1.0)
        guard_crash_loop(store, "s", "a", crash_loop_of(jobs[0]))
        assert "s" in paused(store)


# ---------------------------------------------------------------- scoped to the failing config


def paused_configs_of(store: Store) -> dict[tuple[str, str], str]:
    return {(p.suite, p.config): p.reason for p in paused_configs(store)}


def test_a_failing_config_pauses_alone_and_the_suite_only_when_every_config_has(db_path: Path, tmp_path: Path) -> None:
    plans = write_suite(tmp_path / "plans", "mix", configs=("bad", "good", "worse"), crash_loop={"failures": 2})
    with Store(db_path) as store:
        jobs = submit(store, plans, "mix", 2)  # config-major: bad 1-2, good 3-4, worse 5-6
        by_config = {config: [j for j in jobs if j.config_name == config] for config in ("bad", "good", "worse")}
        for job in by_config["bad"]:
            add_failed_attempt(store, job, ran_s=1.0)
        add_failed_attempt(store, by_config["worse"][0], ran_s=1.0)
        for config in ("bad", "worse"):
            guard_crash_loop(store, "mix", config, crash_loop_of(jobs[0]))
        # two fast failures of `bad`: it pauses; one of `worse` is not enough; `good` never failed
        assert paused_configs_of(store) == {("mix", "bad"): "2 attempts failed within 30 s each in the last 5 min"}
        assert paused(store) == {}
        (event,) = events(store, "pause")
        assert "config bad of suite mix paused" in event.message and "its other configs run on" in event.message
        add_failed_attempt(store, by_config["worse"][1], ran_s=1.0)
        guard_crash_loop(store, "mix", "worse", crash_loop_of(jobs[0]))
        assert set(paused_configs_of(store)) == {("mix", "bad"), ("mix", "worse")}
        assert paused(store) == {}  # `good` is healthy: the suite runs on
        for job in by_config["good"]:
            add_failed_attempt(store, job, ran_s=1.0)
        guard_crash_loop(store, "mix", "good", crash_loop_of(jobs[0]))
        assert paused(store) == {"mix": "all 3 configs paused by the crash-loop guard, the last for "
                                        "2 attempts failed within 30 s each in the last 5 min"}


def test_a_paused_configs_jobs_wait_and_the_others_are_placed() -> None:
    from orchestrator.scheduling.packing.pack import pack
    from tests.test_packing import NO_HEADROOM, gpu, job, placed

    queue = [job(1, 4, suite="mix", config="bad"), job(2, 4, suite="mix", config="good")]
    decision = pack(queue, [gpu(0)], [], NO_HEADROOM, 0.0, paused_configs={("mix", "bad")})
    assert placed(decision) == {2: 0}
    assert decision.wait_reasons == {1: "config bad of suite mix is paused"}


def test_status_says_what_is_paused_and_why_and_resume_lifts_it(orch_inproc: OrchRunner, db_path: Path,
                                                                tmp_path: Path) -> None:
    plans = write_suite(tmp_path / "plans", "mix", configs=("bad", "good"), crash_loop={"failures": 2})
    with Store(db_path) as store:
        jobs = submit(store, plans, "mix", 3)
        for job in jobs[:2]:
            add_failed_attempt(store, job, ran_s=1.0)
        guard_crash_loop(store, "mix", "bad", crash_loop_of(jobs[0]))
    status = json.loads(orch_inproc("status", "--json").stdout)
    assert [(p["suite"], p["config"], p["queued"]) for p in status["paused_configs"]] == [("mix", "bad", 3)]
    assert status["paused_suites"] == []
    out = orch_inproc("status", "--once").stdout
    assert ("config bad of suite mix paused: 2 attempts failed within 30 s each in the last 5 min (orch resume mix); "
            "3 queued job(s) wait for it") in out
    assert orch_inproc("resume", "mix").rc == 0
    assert json.loads(orch_inproc("status", "--json").stdout)["paused_configs"] == []
    assert orch_inproc("resume", "mix").rc == 2  # nothing of it is paused now
