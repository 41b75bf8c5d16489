"""state.db: migrations, checked transitions with their events, idempotent submit, file mode,
corrupt and locked databases."""

from __future__ import annotations

import json
import sqlite3
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlite_utils

import orchestrator.store.db as store_db
import orchestrator.store.jobs as store_jobs
from orchestrator.errors import InvalidTransition, JobNotFound, StoreError
from orchestrator.lifecycle import JobState
from orchestrator.plans import GpuPlan, JobSpec, Suite, expand_jobs, load_suite, parse_pairs
from orchestrator.prediction.job_facts import job_host_settings
from orchestrator.prediction.ladder import NO_HOST_STEPS
from orchestrator.store import Store
from orchestrator.store.jobs import (
    cancel_queued,
    get_gpu_plan,
    set_gpu_plan,
    submit_jobs,
    transition,
)
from orchestrator.store.migrations import MIGRATIONS
from orchestrator.store.queries import get_job
from orchestrator.store.rows import Job
from orchestrator.store.sweep_attempts import all_attempts
from tests.store_helpers import old_database_with_one_job
from tests.store_reads import events, job_count, state_of

PLANS = Path(__file__).resolve().parent.parent / "plans"


@pytest.fixture(scope="module")
def demo() -> Suite:
    return load_suite("demo", PLANS)


@pytest.fixture
def store(db_path: Path) -> Iterator[Store]:
    with Store(db_path) as opened:
        yield opened


def specs_of(suite: Suite, pairs: str = "87:glue_rte") -> list[JobSpec]:
    return expand_jobs(suite, parse_pairs(pairs), {}, None, 0)


def submit(
    store: Store, suite: Suite, specs: list[JobSpec], *, force: bool = False, dry_run: bool = False
) -> list[store_jobs.SubmitOutcome]:
    return submit_jobs(store, suite, specs, allowed_gpus=None, priority=0, force=force, dry_run=dry_run)


def job_state(store: Store, job_id: int) -> str:
    return state_of(store, job_id)


def event_count(store: Store) -> int:
    return len(events(store))


# ---------------------------------------------------------------- migrations and file


def all_migration_names() -> list[str]:
    """Every registered migration, in order: what a fresh database must end up with."""
    return [m.name for m in MIGRATIONS.pending(sqlite_utils.Database(memory=True))]


def test_migrations_apply_once_and_are_recorded(db_path: Path) -> None:
    Store(db_path).close()
    with Store(db_path) as again:
        assert again.pending_migrations() == []
        rows = again.query("SELECT migration_set, name FROM _sqlite_migrations")
    names = all_migration_names()
    assert names[0] == "m001_initial" and "m002_crash_loop" in names
    # the table lists them by name; branches merged in any order register them out of name order
    assert sorted(rows, key=lambda r: r["name"]) == [{"migration_set": "orch", "name": name} for name in sorted(names)]


def test_jobs_queued_before_host_steps_have_none(db_path: Path) -> None:
    # A state.db migrated up to just before the host-steps column, with a job in it.
    old_database_with_one_job(db_path, stop_before="m004_host_steps")
    with Store(db_path) as store:
        job = store.query("SELECT * FROM jobs")[0]
    assert job["host_steps_json"] == "[]"
    assert job_host_settings(Job.from_row(job)) == NO_HOST_STEPS


def test_attempts_from_before_executors_keep_their_window_as_executor_id(db_path: Path) -> None:
    # A tmux attempt recorded by `launcher`/`window_id` only (before m011), and one after m011
    # with both pairs: each ends up with one executor record.
    old_database_with_one_job(db_path, stop_before="m021_one_executor_record")
    conn = sqlite3.connect(str(db_path))
    for attempt_id, executor, executor_id in ((1, None, None), (2, "tmux", "@9")):
        conn.execute(
            "INSERT INTO attempts (id, job_id, n, gpu_index, gpu_uuid, level, run_dir, predicted_peak_mib, "
            "prediction_source, reserved_mib, started_at, launcher, window_id, executor, executor_id) "
            "VALUES (?, 1, ?, 0, 'GPU-0', 0, 'r', 1024, 'declared', 1024, 0, 'tmux', ?, ?, ?)",
            (attempt_id, attempt_id, f"@{attempt_id}", executor, executor_id),
        )
    conn.commit()
    conn.close()
    with Store(db_path) as store:
        attempts = all_attempts(store)
    assert [(a.executor, a.executor_id) for a in attempts] == [("tmux", "@1"), ("tmux", "@9")]


def test_rung_values_from_before_rules_were_kept_are_kept_under_their_suite_s_newest_rule(db_path: Path) -> None:
    # A rung value recorded before m060, for a suite and task whose newest job has a rule: it was
    # told under that rule, and is read back under it.
    from orchestrator.store.early_stop import read_rungs

    old_database_with_one_job(db_path, stop_before="m060_early_stop_rung_rule")
    rule = {"rule": "asha", "metric": "val_loss", "mode": "min", "min_steps": 48, "reduction_factor": 3}
    conn = sqlite3.connect(str(db_path))
    conn.execute("UPDATE jobs SET early_stop_json = ?", (json.dumps(rule),))
    conn.execute("INSERT INTO early_stop_rungs (suite, data, setting, rung, step, value) "
                 "VALUES ('old', 'task', 'a {}', 0, 48, 0.5)")
    conn.commit()
    conn.close()
    with Store(db_path) as store:
        told = read_rungs(store, "old", "task", rule)
        assert [(r.setting, r.rung, r.step, r.value) for r in told] == [("a {}", 0, 48.0, 0.5)]
        assert read_rungs(store, "old", "task", {**rule, "min_steps": 32}) == []


def test_concurrent_first_opens_migrate_once(db_path: Path) -> None:
    errors: list[BaseException] = []

    def open_once() -> None:
        try:
            Store(db_path).close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_once) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    with Store(db_path) as store:
        assert len(store.query("SELECT * FROM _sqlite_migrations")) == len(all_migration_names())


def test_state_db_is_owner_only(db_path: Path, demo: Suite) -> None:
    with Store(db_path) as store:
        submit(store, demo, specs_of(demo))
        for path in (db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")):
            if path.exists():
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_open_without_create_refuses_a_missing_db(db_path: Path) -> None:
    with pytest.raises(StoreError, match="no state database"):
        Store(db_path, create=False)
    assert not db_path.exists()


@pytest.mark.parametrize("garbage", [b"not a database at all\n" * 400, bytes(range(256)) * 64])
def test_corrupt_db_is_a_store_error(db_path: Path, garbage: bytes) -> None:
    db_path.write_bytes(garbage)
    with pytest.raises(StoreError, match="corrupt or not an orch database") as info:
        Store(db_path)
    assert str(db_path) in str(info.value)
    assert db_path.read_bytes() == garbage  # nothing written over the user's file


def test_locked_db_is_a_store_error(db_path: Path, monkeypatch: pytest.MonkeyPatch, demo: Suite) -> None:
    Store(db_path).close()
    monkeypatch.setattr(store_db, "BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(str(db_path), isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        with Store(db_path) as store, pytest.raises(StoreError, match="locked"):
            submit(store, demo, specs_of(demo))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with Store(db_path) as store:
        assert job_count(store) == 0


def test_unwritable_directory_is_a_store_error(tmp_path: Path) -> None:
    locked_dir = tmp_path / "ro"
    locked_dir.mkdir()
    locked_dir.chmod(0o500)
    try:
        if _can_write(locked_dir):
            pytest.skip("running as a user that ignores directory permissions")
        with pytest.raises(StoreError):
            Store(locked_dir / "state.db")
    finally:
        locked_dir.chmod(0o700)


def _can_write(directory: Path) -> bool:
    try:
        (directory / "probe").write_text("")
    except OSError:
        return False
    (directory / "probe").unlink()
    return True


# ---------------------------------------------------------------- transitions


def test_transition_writes_state_and_event_together(store: Store, demo: Suite) -> None:
    (outcome, *_) = submit(store, demo, specs_of(demo))
    assert outcome.job_id is not None
    job_id = outcome.job_id
    left = transition(store, job_id, JobState.RUNNING, message="started", kind="start")
    assert left is JobState.QUEUED
    assert job_state(store, job_id) == "running"
    logged = [(e.kind, e.from_state, e.to_state, e.message) for e in events(store, job_id=job_id)]
    assert logged == [("submitted", None, "queued", logged[0][3]), ("start", "queued", "running", "started")]


def test_forbidden_transition_writes_nothing(store: Store, demo: Suite) -> None:
    job_id = submit(store, demo, specs_of(demo))[0].job_id
    assert job_id is not None
    before_events = event_count(store)
    before = get_job(store, job_id)
    with pytest.raises(InvalidTransition, match="queued -> succeeded is not allowed"):
        transition(store, job_id, JobState.SUCCEEDED, message="x", fields={"reason": "should not stick"})
    assert event_count(store) == before_events
    assert get_job(store, job_id) == before


def test_expect_from_mismatch_writes_nothing(store: Store, demo: Suite) -> None:
    job_id = submit(store, demo, specs_of(demo))[0].job_id
    assert job_id is not None
    before = event_count(store)
    with pytest.raises(InvalidTransition, match="is queued, expected running"):
        transition(store, job_id, JobState.SUCCEEDED, message="x", expect_from=[JobState.RUNNING])
    assert job_state(store, job_id) == "queued" and event_count(store) == before


def test_compare_and_swap_refuses_a_state_changed_underneath(
    store: Store, demo: Suite, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = submit(store, demo, specs_of(demo))[0].job_id
    assert job_id is not None
    before = event_count(store)
    real_check = store_jobs.check_transition

    def racing_check(from_state: JobState | None, to_state: JobState) -> None:
        # Another writer moves the job between the read and the UPDATE.
        store.execute("UPDATE jobs SET state = 'cancelled' WHERE id = ?", [job_id])
        real_check(from_state, to_state)

    monkeypatch.setattr(store_jobs, "check_transition", racing_check)
    with pytest.raises(InvalidTransition, match="changed state while being updated"):
        transition(store, job_id, JobState.RUNNING, message="x")
    monkeypatch.undo()
    # The whole transaction rolled back: no event, and the job is as it was.
    assert job_state(store, job_id) == "queued" and event_count(store) == before


def test_transition_of_a_missing_job(store: Store) -> None:
    with pytest.raises(JobNotFound, match="no job 404"):
        transition(store, 404, JobState.RUNNING, message="x")


def test_cancel_queued_only_cancels_queued(store: Store, demo: Suite) -> None:
    first, second = (o.job_id for o in submit(store, demo, specs_of(demo))[:2])
    assert first is not None and second is not None
    cancel_queued(store, first, "by hand")
    cancelled = get_job(store, first)
    assert (cancelled.state, cancelled.reason) == (JobState.CANCELLED, "by hand")
    transition(store, second, JobState.RUNNING, message="started")
    with pytest.raises(InvalidTransition):
        cancel_queued(store, second, "too late")
    assert job_state(store, second) == "running"


def test_requeue_resets_queued_at_and_wait_reason(store: Store, demo: Suite) -> None:
    job_id = submit(store, demo, specs_of(demo))[0].job_id
    assert job_id is not None
    transition(store, job_id, JobState.RUNNING, message="s", fields={"wait_reason": None})
    store_before = get_job(store, job_id).queued_at
    with store.write():
        store.execute("UPDATE jobs SET wait_reason = 'stale' WHERE id = ?", [job_id])
    transition(store, job_id, JobState.QUEUED, message="oom, requeued")
    requeued = get_job(store, job_id)
    assert requeued.wait_reason is None and requeued.queued_at >= store_before


# ---------------------------------------------------------------- submit


def test_submit_is_idempotent(store: Store, demo: Suite) -> None:
    specs = specs_of(demo, "87:glue_rte 13:glue_rte")
    first = submit(store, demo, specs)
    assert [o.created for o in first] == [True] * 6
    again = submit(store, demo, specs)
    assert [o.created for o in again] == [False] * 6
    assert [o.job_id for o in again] == [o.job_id for o in first]
    assert {o.existing_state for o in again} == {"queued"}
    assert job_count(store) == 6


def test_force_duplicates(store: Store, demo: Suite) -> None:
    specs = specs_of(demo)
    submit(store, demo, specs)
    forced = submit(store, demo, specs, force=True)
    assert all(o.created for o in forced)
    assert job_count(store) == 2 * len(specs)


def test_dry_run_writes_nothing(store: Store, demo: Suite) -> None:
    before = event_count(store)
    outcomes = submit(store, demo, specs_of(demo), dry_run=True)
    assert all(o.created and o.job_id is None for o in outcomes)
    assert job_count(store) == 0
    assert event_count(store) == before


@pytest.mark.parametrize(
    ("path", "blocks"),
    [
        ([], True),  # queued
        ([JobState.RUNNING], True),
        ([JobState.RUNNING, JobState.SUCCEEDED], True),
        ([JobState.RUNNING, JobState.FAILED], False),
        ([JobState.FAILED], False),  # queued -> failed: nothing on the ladder fits
        ([JobState.CANCELLED], False),
        ([JobState.RUNNING, JobState.CANCELLED], False),
    ],
)
def test_only_queued_running_or_succeeded_block_a_resubmit(
    store: Store, demo: Suite, path: list[JobState], blocks: bool
) -> None:
    spec = specs_of(demo)[:1]
    job_id = submit(store, demo, spec)[0].job_id
    assert job_id is not None
    for state in path:
        transition(store, job_id, state, message=f"to {state.value}")
    (outcome,) = submit(store, demo, spec)
    if blocks:
        assert not outcome.created and outcome.job_id == job_id
        assert outcome.existing_state == (path[-1].value if path else "queued")
    else:
        assert outcome.created and outcome.job_id not in (None, job_id)
        assert job_state(store, job_id) == path[-1].value  # the old job keeps its history
        assert job_state(store, outcome.job_id) == "queued"


def test_submit_records_suite_fields(store: Store, demo: Suite) -> None:
    outcome = submit_jobs(
        store, demo, specs_of(demo)[:1], allowed_gpus=[2, 0], priority=5, force=False, dry_run=False
    )[0]
    job = get_job(store, outcome.job_id)
    assert job.declared_mib == round(demo.mem_gib * 1024)
    assert job.allowed_gpus == frozenset({2, 0})
    assert job.priority == 5 and job.max_attempts == demo.max_attempts
    assert job.one_token is True  # glue_rte matches the demo suite's glue* pattern
    assert job.identity == outcome.spec.identity


# ---------------------------------------------------------------- GPU plan


def test_gpu_plan_round_trip(store: Store) -> None:
    assert get_gpu_plan(store) == GpuPlan()
    set_gpu_plan(store, GpuPlan(slots_by_gpu={0: 2, 1: 0}))
    set_gpu_plan(store, GpuPlan(slots_by_gpu={1: 3}))  # a new plan replaces the old one whole
    assert get_gpu_plan(store) == GpuPlan(slots_by_gpu={1: 3})
    set_gpu_plan(store, GpuPlan(default_slots=4))  # a broadcast replaces every cap
    assert get_gpu_plan(store) == GpuPlan(default_slots=4)
    assert len(events(store, "plan")) == 3


def test_prompt_lengths_keep_the_longest_report(store: Store) -> None:
    from orchestrator.store.attempts import read_all_prompt_lengths, record_prompt_length

    assert read_all_prompt_lengths(store) == {}
    record_prompt_length(store, "m|glue_rte|256", 34)
    record_prompt_length(store, "m|glue_rte|256", 30)  # a shorter report does not lower it
    record_prompt_length(store, "m|glue_qnli|256", 80)
    assert read_all_prompt_lengths(store) == {"m|glue_rte|256": 34, "m|glue_qnli|256": 80}
    record_prompt_length(store, "m|glue_rte|256", 41)
    assert read_all_prompt_lengths(store)["m|glue_rte|256"] == 41
