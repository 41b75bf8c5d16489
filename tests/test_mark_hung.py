"""Marking an attempt hung never overwrites a stop the user asked for since the daemon read it."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.lifecycle import KillRequest
from orchestrator.plans import expand_jobs, load_suite, parse_pairs
from orchestrator.store import Store
from orchestrator.store.attempts import AttemptPlan, start_attempt, update_attempt
from orchestrator.store.endings import mark_hung
from orchestrator.store.jobs import submit_jobs
from orchestrator.store.peak_source import PredictionSource, SourceKind
from orchestrator.store.rows import Attempt
from tests.store_reads import events, job_ids

PLANS = Path(__file__).resolve().parents[1] / "plans"


def _started_attempt(store: Store, db_path: Path) -> Attempt:
    """One job of the demo suite, its first attempt started (as the daemon's pass reads it)."""
    suite = load_suite("demo", PLANS)
    submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:glue_rte"), {}, None, 0),
                allowed_gpus=None, priority=0, force=False, dry_run=False)
    job_id = job_ids(store)[0]
    plan = AttemptPlan(job_id, 0, "GPU-0", 0, "base", {}, {}, False, 1024, PredictionSource(SourceKind.DECLARED), 1024)
    return start_attempt(store, plan, lambda n: db_path.parent / f"run-{n}")


def _hung_events(store: Store, attempt_id: int) -> int:
    return len([e for e in events(store, "hung") if e.attempt_id == attempt_id])


@pytest.mark.parametrize("asked", [KillRequest.CANCEL, KillRequest.RETRY])
def test_a_cancel_or_retry_asked_for_meanwhile_stays(db_path: Path, asked: KillRequest) -> None:
    with Store(db_path) as store:
        read_by_the_pass = _started_attempt(store, db_path)
        update_attempt(store, read_by_the_pass.id, kill_requested=asked.value)  # `orch cancel` meanwhile
        after = mark_hung(store, read_by_the_pass, "silent: killing it")
        assert after.kill_requested is asked
        assert _hung_events(store, after.id) == 0


def test_a_silent_attempt_is_marked_once(db_path: Path) -> None:
    with Store(db_path) as store:
        attempt = _started_attempt(store, db_path)
        assert mark_hung(store, attempt, "silent").kill_requested is KillRequest.HUNG
        assert mark_hung(store, attempt, "silent").kill_requested is KillRequest.HUNG  # a restarted daemon
        assert _hung_events(store, attempt.id) == 1
