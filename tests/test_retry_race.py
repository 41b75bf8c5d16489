"""A retry meets the job in whatever state the daemon moved it to since the retry read it: a
running job that ends between the read and the stop request is retried as it is now."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.actions import user_actions
from orchestrator.actions.user_actions import Done, retry_job
from orchestrator.errors import UsageError
from orchestrator.lifecycle import JobState, KillRequest
from orchestrator.store import Store
from orchestrator.store.attempts import AttemptEnd, AttemptPlan, finish_attempt, start_attempt
from orchestrator.store.control import LiveProcess
from orchestrator.store.peak_source import PredictionSource, SourceKind
from orchestrator.store.queries import get_job, live_attempt
from tests.conftest import OrchRunner
from tests.store_reads import events
from tests.test_cli_fixes_take import FIXED, TYPO, worker_of, write_suite

FAILED = AttemptEnd("failed", "exit code 1", 1, None, 0, JobState.FAILED, {"reason": "exit code 1"}, "job failed")
LOST = AttemptEnd("lost", "its tmux window vanished", None, None, 0, JobState.QUEUED, {"reason": None}, "requeued")
MAX_ATTEMPTS = 8  # a suite's default
SUCCEEDED = AttemptEnd("succeeded", "", 0, None, 0, JobState.SUCCEEDED, {"reason": None}, "succeeded")


@pytest.fixture
def running_job(orch_inproc: OrchRunner, db_path: Path, tmp_path: Path) -> int:
    """Job 1 of suite `mine`, running its first attempt (submitted with the TYPO worker)."""
    write_suite(tmp_path / "plans", TYPO)
    assert orch_inproc("submit", "--suite", "mine", "--pairs", "1:glue_rte").rc == 0
    with Store(db_path) as store:
        plan = AttemptPlan(1, 0, "GPU-0", 0, "base", {}, {}, False, 1024, PredictionSource(SourceKind.DECLARED), 1024)
        start_attempt(store, plan, lambda n: tmp_path / f"run-1-{n}")
        job = get_job(store, 1)
        assert (job.state, job.max_attempts) == (JobState.RUNNING, MAX_ATTEMPTS)
    return 1


def daemon_ends_it_first(monkeypatch: pytest.MonkeyPatch, end: AttemptEnd) -> list[int]:
    """The daemon records the attempt's end after retry read the job as running and before its
    stop request lands. Returns the stop requests made, by job id."""
    real_request_stop = user_actions.request_stop
    calls: list[int] = []

    def request_stop(store: Store, job_id: int, why: KillRequest) -> LiveProcess | None:
        if not calls:
            attempt = live_attempt(store, job_id)
            assert attempt is not None
            assert finish_attempt(store, attempt, end)
        calls.append(job_id)
        return real_request_stop(store, job_id, why)

    monkeypatch.setattr(user_actions, "request_stop", request_stop)
    return calls


def test_a_job_that_failed_between_retrys_read_and_write_is_requeued(
    orch_inproc: OrchRunner, db_path: Path, tmp_path: Path, running_job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = daemon_ends_it_first(monkeypatch, FAILED)
    write_suite(tmp_path / "plans", FIXED)
    retried = orch_inproc("retry", str(running_job), "--json")
    assert retried.rc == 0, retried.stderr
    assert json.loads(retried.stdout) == {"requeued": [1], "restarting": []}
    assert calls == [running_job]  # one stop request, which found the attempt ended
    with Store(db_path) as store:
        job = get_job(store, running_job)
        assert (job.state, job.attempt_count) == (JobState.QUEUED, 1)
        assert job.max_attempts == 1 + MAX_ATTEMPTS  # the budget renewed, as for any failed job retried
        said = [(e.kind, e.message) for e in events(store, job_id=running_job)]
        assert said[-3][0] == "end:failed" and said[-1] == ("retry", "requeued by orch retry")
        assert "retry requested by user" not in [message for _, message in said]  # no stop was asked of anything
    assert worker_of(db_path, running_job) == FIXED  # requeued as a failed job is: with the suite file as it is now


def test_a_job_the_daemon_requeued_meanwhile_is_left_queued_and_starts_fresh_if_asked(
    db_path: Path, running_job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon_ends_it_first(monkeypatch, LOST)
    with Store(db_path) as store:
        assert retry_job(store, running_job, fresh=True) is Done.REQUEUED
        job = get_job(store, running_job)
        assert (job.state, job.fresh_after_attempt) == (JobState.QUEUED, 1)
        assert job.max_attempts == MAX_ATTEMPTS  # not renewed: its attempts were not used up


def test_a_job_that_succeeded_meanwhile_keeps_its_success(
    db_path: Path, running_job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon_ends_it_first(monkeypatch, SUCCEEDED)
    with Store(db_path) as store:
        with pytest.raises(UsageError,
                           match="job 1 succeeded: a retry is for failed, cancelled, pruned or running jobs"):
            retry_job(store, running_job)
        assert get_job(store, running_job).state is JobState.SUCCEEDED


def test_a_failed_job_requeued_by_another_retry_meanwhile_is_requeued_once(
    db_path: Path, running_job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(db_path) as store:
        attempt = live_attempt(store, running_job)
        assert attempt is not None and finish_attempt(store, attempt, FAILED)
        real_transition: Callable[..., JobState] = user_actions.transition
        retries: list[int] = []

        def another_retry_lands_first(*args: object, **kwargs: object) -> JobState:
            if not retries:
                retries.append(1)
                assert retry_job(store, running_job) is Done.REQUEUED  # the other retry, done in full
            return real_transition(*args, **kwargs)

        monkeypatch.setattr(user_actions, "transition", another_retry_lands_first)
        assert retry_job(store, running_job) is Done.REQUEUED
        assert get_job(store, running_job).state is JobState.QUEUED
        assert [e.kind for e in events(store, job_id=running_job)].count("retry") == 1
