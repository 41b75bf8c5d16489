"""Start-up learning for overlap: the first step's time and what was held before it, per suite
and config; a running attempt's remaining time from its progress; the expected end the
scheduler hands `pack`."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_helpers import declared_plan

from orchestrator.attempts.startup_lesson import STEP_TOLERANCE_S, learn_startup, startup_from
from orchestrator.executors.observation import Observation
from orchestrator.plans import expand_jobs, load_suite, parse_pairs
from orchestrator.prediction.durations import CompletedRun, DurationTable
from orchestrator.prediction.startup import (
    END_MARGIN_SHARE,
    EXIT_S,
    HeldReadings,
    Startup,
    first_step_seen,
    remaining_s,
    startup_key,
)
from orchestrator.scheduling.dispatch import _expected_end
from orchestrator.store import Store
from orchestrator.store.attempts import start_attempt, update_attempt
from orchestrator.store.jobs import submit_jobs
from orchestrator.store.queries import get_attempts, get_job
from orchestrator.store.rows import Attempt, Job
from orchestrator.store.startups import read_startups
from tests.store_reads import job_ids

PLANS = Path(__file__).resolve().parents[1] / "plans"


def test_the_first_step_is_seen_once() -> None:
    assert first_step_seen(None, 1) and first_step_seen(0, 3)
    assert not first_step_seen(1, 2)  # seen before
    assert not first_step_seen(None, 0) and not first_step_seen(None, None) and not first_step_seen(None, True)


def test_remaining_time_is_the_steps_to_go_at_the_pace_since_start_up() -> None:
    # started at 0, 40 s of start-up, 30 steps in the next 60 s: 2 s a step, 70 steps to go
    assert remaining_s(100.0, 0.0, 40.0, 30, 100) == pytest.approx(140.0)
    assert remaining_s(100.0, 0.0, None, 50, 100) == pytest.approx(100.0)  # start-up unknown: from launch
    assert remaining_s(30.0, 0.0, 40.0, 1, 100) is None  # still inside the learned start-up
    assert remaining_s(100.0, 0.0, 40.0, 0, 100) is None and remaining_s(100.0, 0.0, 40.0, 5, None) is None
    assert remaining_s(100.0, 0.0, 40.0, 100, 100) == 0.0
    # its own first step seen (step 1 at 40 s): 29 steps in the next 60 s; the kind's shortest
    # start-up (30 s) no longer counts the first step's own time as training
    assert remaining_s(100.0, 0.0, 30.0, 30, 100, first_step=(1, 60.0)) == pytest.approx(70 * 60.0 / 29)
    assert remaining_s(100.0, 0.0, 30.0, 30, 100) == pytest.approx(70 * 70.0 / 30)  # without it: faster
    assert remaining_s(41.0, 0.0, 30.0, 1, 100, first_step=(1, 1.0)) is None  # no step since the first
    assert remaining_s(100.0, 0.0, 30.0, 30, 100, first_step=(10, 60.0)) == pytest.approx(70 * 60.0 / 20)
    assert remaining_s(100.0, 0.0, 30.0, 30, 100, first_step=(1, 0.0)) is None  # no time since: no pace


def test_a_start_up_a_wall_clock_step_moved_is_not_learned() -> None:
    assert startup_from(38.0, 36.0, adopted=False) == 38.0  # the daemon's passes come a little late
    assert startup_from(38.0, None, adopted=False) == 38.0  # nothing to check against
    assert startup_from(3600.0 + 38.0, 36.0, adopted=False) is None  # +1 h while it started: an hour-long start-up
    assert startup_from(-3600.0 + 38.0, 36.0, adopted=False) is None  # -1 h: negative
    assert startup_from(10.0, 36.0 + 3600.0, adopted=True) is None  # shorter than this daemon watched it
    # adopted after a restart: this daemon watched only the end of its start-up
    assert startup_from(120.0, 5.0, adopted=True) == 120.0
    assert startup_from(36.0 + STEP_TOLERANCE_S + 1, 36.0, adopted=False) is None


def _obs(step: int | None, at: float | None) -> Observation:
    progress = None if step is None else {"step": step, "total": 100}
    return Observation(None, None, True, progress, at, at or 0.0)


def _started_attempt(store: Store, db_path: Path, held_mib: int) -> tuple[Attempt, Job]:
    """One job of the demo suite, its first attempt started and holding `held_mib` now."""
    suite = load_suite("demo", PLANS)
    submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:glue_rte"), {}, None, 0),
                allowed_gpus=None, priority=0, force=False, dry_run=False)  # fmt: skip
    job_id = job_ids(store)[0]
    attempt = start_attempt(store, declared_plan(job_id), lambda n: db_path.parent / f"run-{n}")
    update_attempt(store, attempt.id, held_mib=held_mib)
    (attempt,) = get_attempts(store, job_id)
    job = get_job(store, job_id)
    assert job is not None
    return attempt, job


def test_an_attempt_teaches_its_start_up_at_its_first_step(db_path: Path) -> None:
    with Store(db_path) as store:
        attempt, job = _started_attempt(store, db_path, held_mib=900)
        job_id = job.id
        readings = HeldReadings()
        readings.note(attempt.id, attempt.started_at + 1.0, 900)
        learn_startup(store, attempt, job, _obs(0, attempt.started_at + 10), attempt.started_at + 10,
                      readings=readings)  # fmt: skip
        assert read_startups(store) == {}  # step 0: still starting
        stepped = _obs(2, attempt.started_at + 3600 + 38.0)  # the wall clock went an hour ahead while it started
        learn_startup(store, attempt, job, stepped, attempt.started_at + 3600 + 39, watched_s=39.0, readings=readings)
        assert read_startups(store) == {}  # not learned as an hour-long start-up
        # nothing read before its first step (a daemon started since, a remote process): not learned
        learn_startup(store, attempt, job, _obs(2, attempt.started_at + 38.0), attempt.started_at + 39, watched_s=39.0)
        assert read_startups(store) == {}
        (seen,) = get_attempts(store, job_id)
        assert seen.first_step == 2 and seen.first_step_at == pytest.approx(attempt.started_at + 38.0, abs=1e-6)
        learn_startup(store, attempt, job, _obs(2, attempt.started_at + 38.0), attempt.started_at + 39, watched_s=39.0,
                      readings=readings)  # fmt: skip
        key = startup_key(job.suite, job.config_name)
        assert read_startups(store) == {key: Startup(pytest.approx(38.0), 900, 1)}  # type: ignore[arg-type]
        update_attempt(store, attempt.id, progress_json='{"step": 2, "total": 100}')
        (attempt,) = get_attempts(store, job_id)
        learn_startup(store, attempt, job, _obs(5, attempt.started_at + 50.0), attempt.started_at + 50,
                      readings=readings)  # fmt: skip
        assert read_startups(store)[key].samples == 1  # the first step is learned once
        from orchestrator.store.startups import record_startup

        record_startup(store, key, 45.0, 1_200)
        record_startup(store, key, 30.0, 1_000)
        assert read_startups(store)[key] == Startup(30.0, 1_200, 3)  # the shortest, the most held

        # the scheduler's expected end: by progress once start-ups are read, else the learned run time
        durations = DurationTable([CompletedRun(job.config_name, job.data, 0, 500.0)])
        live = {job.id: job}
        now = attempt.started_at + 90.0  # 30 steps done, 90 s after its start
        update_attempt(store, attempt.id, progress_json='{"step": 30, "total": 100}')
        (attempt,) = get_attempts(store, job_id)
        # its own pace: 28 steps since its first step seen (step 2 at 38 s), a quarter slower, and its exit
        by_progress = now + 70 * (52.0 / 28) * (1 + END_MARGIN_SHARE) + EXIT_S
        short = DurationTable([CompletedRun(job.config_name, job.data, 0, 100.0)])
        learned = read_startups(store)
        exact = {"abs": 1e-6}  # epoch-scale times: the default relative tolerance is about half an hour
        assert _expected_end(live, short, learned, now)(attempt) == pytest.approx(by_progress, **exact)
        assert _expected_end(live, DurationTable([]), learned, now)(attempt) == pytest.approx(by_progress, **exact)
        # its age on the daemon's own clock: the first step seen 52 s ago fits within its 90 s
        aged = _expected_end(live, short, learned, now, run_age_s=lambda a: 90.0)(attempt)
        assert aged == pytest.approx(by_progress, **exact)
        # the wall clock stepped an hour back since its first step was seen: its own pace is not
        # read, and the kind's start-up (30 s) gives 60 s for 30 steps
        back = now - 3600.0
        stepped_end = _expected_end(live, DurationTable([]), learned, back, run_age_s=lambda a: 90.0)(attempt)
        assert stepped_end == pytest.approx(back + 70 * 2.0 * (1 + END_MARGIN_SHARE) + EXIT_S, **exact)
        # the later of the two: a run of its kind took 500 s
        by_kind = attempt.started_at + 500.0
        assert _expected_end(live, durations, learned, now)(attempt) == pytest.approx(by_kind, **exact)
        assert _expected_end(live, durations, {}, now)(attempt) == pytest.approx(by_kind, **exact)


def test_the_hold_is_what_the_start_up_held_before_its_first_steps_memory() -> None:
    from orchestrator.prediction.startup import HOLD_LEAD_S, HeldReadings, ahead_s

    readings = HeldReadings()
    # TRL-like: the model loaded by 10 s, the first step's activations read at 23 s, its progress
    # line seen at 24 s
    for at_s, held in ((1.0, 0), (4.0, 480), (10.0, 1_350), (12.0, 1_300), (18.0, 1_360), (23.0, 13_814)):
        readings.note(7, 1000.0 + at_s, held)
    assert readings.held_until(7, 1000.0 + 24.0 - HOLD_LEAD_S) == 1_360
    assert readings.held_until(7, 1000.0 + 24.0) == 13_814
    assert readings.held_until(7, 1000.5) is None and readings.held_until(8, 2000.0) is None
    readings.keep_only([8])
    assert readings.held_until(7, 2000.0) is None
    assert ahead_s(Startup(24.0, 1_360, 1)) == pytest.approx(24.0 - HOLD_LEAD_S)
    assert ahead_s(Startup(HOLD_LEAD_S, 100, 1)) is None and ahead_s(None) is None


def test_an_attempt_learns_its_hold_from_readings_before_the_lead(db_path: Path) -> None:
    with Store(db_path) as store:
        attempt, job = _started_attempt(store, db_path, held_mib=13_814)  # the last reading: the first step's
        readings = HeldReadings()
        for at_s, held in ((2.0, 500), (15.0, 1_360), (23.0, 13_814)):
            readings.note(attempt.id, attempt.started_at + at_s, held)
        seen = attempt.started_at + 24.0
        learn_startup(store, attempt, job, _obs(1, seen), seen, watched_s=24.0, readings=readings)
        key = startup_key(job.suite, job.config_name)
        assert read_startups(store) == {key: Startup(pytest.approx(24.0), 1_360, 1)}  # type: ignore[arg-type]
