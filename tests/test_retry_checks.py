"""`orch retry` checks every job it is given before writing anything; `--fresh` starts the next
attempt without a checkpoint; a resume never crosses a failure or a change of worker command."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_helpers import declared_plan

from orchestrator.lifecycle import JobState
from orchestrator.plans.resume import resumable_attempts
from orchestrator.store import Store
from orchestrator.store.attempts import PastAttempt
from orchestrator.store.queries import get_job
from tests.conftest import OrchRunner
from tests.store_reads import events, job_ids
from tests.test_cli_fixes_take import FIXED, TYPO, fail_and_pause, worker_of, write_suite


@pytest.fixture
def plans(tmp_path: Path) -> Path:
    return tmp_path / "plans"


def _states(db_path: Path) -> list[tuple[int, str, int]]:
    with Store(db_path) as store:
        jobs = [get_job(store, job_id) for job_id in job_ids(store)]
    return [(j.id, j.state.value, j.max_attempts) for j in jobs]


def test_a_retry_with_one_job_it_cannot_take_writes_nothing(
    orch_inproc: OrchRunner, db_path: Path, plans: Path
) -> None:
    write_suite(plans, TYPO)
    assert orch_inproc("submit", "--suite", "mine", "--pairs", "1:glue_rte 2:glue_rte").rc == 0
    fail_and_pause(db_path, 1)
    with Store(db_path) as store, store.write():
        store.execute("UPDATE jobs SET state = 'succeeded' WHERE id = 2")
    write_suite(plans, FIXED)
    before = _states(db_path)
    result = orch_inproc("retry", "1", "2")
    assert result.rc == 2 and "job 2 succeeded" in result.stderr
    assert _states(db_path) == before
    assert worker_of(db_path, 1) == TYPO  # the suite's fixed command was not taken either


def test_retry_fresh_resumes_from_none_of_the_attempts_so_far(
    orch_inproc: OrchRunner, db_path: Path, plans: Path
) -> None:
    write_suite(plans, FIXED)
    assert orch_inproc("submit", "--suite", "mine", "--pairs", "1:glue_rte").rc == 0
    fail_and_pause(db_path, 1)
    assert orch_inproc("retry", "1", "--fresh").rc == 0
    with Store(db_path) as store:
        job = get_job(store, 1)
    assert (job.state, job.fresh_after_attempt) == (JobState.QUEUED, job.attempt_count)


def _past(n: int, outcome: str, reason: str = "", worker: str | None = "w") -> PastAttempt:
    return PastAttempt(n, f"/runs/attempt-{n}", outcome, reason, worker)


def test_a_resume_stops_at_a_failure_a_command_change_and_a_fresh_start() -> None:
    deaths = [_past(1, "oom"), _past(2, "failed", "hung"), _past(3, "failed", "killed by SIGKILL without OOM evidence")]
    assert [n for n, _ in resumable_attempts(deaths, "w", 0)] == [3, 2, 1]
    failed = [_past(1, "oom"), _past(2, "failed", "config error: bad key"), _past(3, "lost")]
    assert [n for n, _ in resumable_attempts(failed, "w", 0)] == [3]
    assert resumable_attempts([*failed[:2], _past(3, "failed", "result.json: loss is nan")], "w", 0) == []
    changed = [_past(1, "oom", worker="old"), _past(2, "oom"), _past(3, "oom", worker=None)]
    assert [n for n, _ in resumable_attempts(changed, "w", 0)] == [3, 2]
    assert [n for n, _ in resumable_attempts(deaths, "w", 2)] == [3]


def test_an_attempt_records_its_command_and_a_cut_checkpoint_search_is_said(db_path: Path) -> None:
    from orchestrator.plans import expand_jobs, load_suite, parse_pairs
    from orchestrator.store.attempts import past_attempts, start_attempt
    from orchestrator.store.jobs import submit_jobs

    plans = Path(__file__).resolve().parents[1] / "plans"
    with Store(db_path) as store:
        suite = load_suite("demo", plans)
        submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:glue_rte"), {}, None, 0),
                    allowed_gpus=None, priority=0, force=False, dry_run=False)
        job_id = job_ids(store)[0]
        plan = declared_plan(job_id, searched_in_part=(2, 1))
        attempt = start_attempt(store, plan, lambda n: db_path.parent / f"run-{n}")
        (past,) = past_attempts(store, job_id)
        worker = get_job(store, job_id).worker
        start = [e for e in events(store, "start") if e.attempt_id == attempt.id]
    assert past.worker == worker
    assert "read the run dir of attempt(s) 2, 1 only in part" in start[0].message
