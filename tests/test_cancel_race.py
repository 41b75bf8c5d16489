"""A cancel meets the job in whatever state the daemon moved it to since cancel read it."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_helpers import declared_plan

from orchestrator.actions import user_actions
from orchestrator.actions.user_actions import Done, cancel_job
from orchestrator.lifecycle import JobState, KillRequest
from orchestrator.plans import expand_jobs, load_suite, parse_pairs
from orchestrator.store import Store
from orchestrator.store.attempts import start_attempt
from orchestrator.store.jobs import submit_jobs
from orchestrator.store.queries import get_job, live_attempt
from tests.store_reads import job_ids

PLANS = Path(__file__).resolve().parents[1] / "plans"


def test_a_job_started_between_cancels_read_and_write_is_stopped(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(db_path) as store:
        suite = load_suite("demo", PLANS)
        submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:a"), {}, None, 0), allowed_gpus=None,
                    priority=0, force=False, dry_run=False)
        job_id = job_ids(store)[0]
        real_cancel_queued = user_actions.cancel_queued
        calls: list[int] = []

        def daemon_starts_it_first(store_: Store, job: int, reason: str) -> JobState:
            if not calls:  # the daemon's launch lands after cancel read the job as queued
                plan = declared_plan(job)
                start_attempt(store_, plan, lambda n: db_path.parent / f"run-{job}-{n}")
            calls.append(job)
            return real_cancel_queued(store_, job, reason)

        monkeypatch.setattr(user_actions, "cancel_queued", daemon_starts_it_first)
        monkeypatch.setattr(user_actions, "daemon_alive", lambda _store: 1)  # the daemon records the end
        assert cancel_job(store, job_id) is Done.STOPPING
        assert get_job(store, job_id).state is JobState.RUNNING
        attempt = live_attempt(store, job_id)
        assert attempt is not None and attempt.kill_requested is KillRequest.CANCEL
        assert calls == [job_id]  # tried once as queued, then stopped as the running job it had become
