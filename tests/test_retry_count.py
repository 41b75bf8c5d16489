"""A move down the ladder is a column: the event that records it is marked when it is written;
an older state.db gets the marks from its events; the dashboard's retries are read through a
partial index, not a LIKE over the events' JSON."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from orchestrator.api.status_snapshot import status_snapshot
from orchestrator.lifecycle import JobState
from orchestrator.plans import expand_jobs, load_suite, parse_pairs
from orchestrator.store import Store
from orchestrator.store.jobs import add_event, submit_jobs, transition
from orchestrator.store.status import recent_retries
from orchestrator.store.web_queries import overview
from tests.store_helpers import old_database_with_one_job

PLANS = Path(__file__).resolve().parent.parent / "plans"
MOVE = {"from_level": 0, "to_level": 1, "why": "CUDA out of memory"}


def _marked(store: Store, job_id: int = 1) -> list[int]:
    return [int(r["retry"]) for r in store.query("SELECT retry FROM events WHERE job_id = ? ORDER BY id", [job_id])]


def test_an_older_database_gets_its_retries_from_its_events(db_path: Path) -> None:
    old_database_with_one_job(db_path, "m013_retry_count")
    conn = sqlite3.connect(str(db_path))
    events = [
        ("end:oom", "attempt 1 oom; requeued at level 1", json.dumps({"gpu": 0, "retry": MOVE})),
        # a value, not a move
        ("end:oom", "attempt 2 oom; requeued unchanged", json.dumps({"gpu": 0, "note": "retry"})),
        ("retry", "requeued by orch retry", None),  # the user's retry: not a move down the ladder
        (
            "end:oom",
            "attempt 3 oom; requeued at level 2",
            json.dumps({"retry": {**MOVE, "from_level": 1, "to_level": 2}}),
        ),
    ]
    for ts, (kind, message, data) in enumerate(events):
        conn.execute("INSERT INTO events (ts, job_id, kind, message, data_json) VALUES (?, 1, ?, ?, ?)",
                     [float(ts), kind, message, data])
    conn.commit()
    conn.close()
    with Store(db_path) as store:
        assert _marked(store) == [1, 0, 0, 1]
        assert [(e.job_id, e.retry["to_level"]) for e in recent_retries(store, 8)] == [(1, 2), (1, 1)]


def test_a_retry_is_marked_where_its_event_is_written(db_path: Path) -> None:
    suite = load_suite("demo", PLANS)
    with Store(db_path) as store:
        outcomes = submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:glue_rte"), {}, None, 0),
                               allowed_gpus=None, priority=0, force=False, dry_run=False)
        job_id = outcomes[0].job_id
        assert job_id is not None
        transition(store, job_id, JobState.RUNNING, message="started")
        transition(store, job_id, JobState.QUEUED, message="attempt 1 oom; requeued at level 1", kind="end:oom",
                   data={"gpu": 0, "retry": MOVE})
        with store.write():
            add_event(store, "note", "a note that names a retry", job_id=job_id, data={"text": "retry"})
        assert _marked(store, job_id) == [0, 0, 1, 0]  # submitted, started, the move, the note
        snapshot = status_snapshot(store, all_jobs=False)
        assert snapshot["retries"] == [{"ts": snapshot["retries"][0]["ts"], "job": job_id, **MOVE}]
        web = overview(store)
        assert [(e.job_id, e.message) for e in web.retries] == [(job_id, "attempt 1 oom; requeued at level 1")]


def test_the_retries_panel_reads_a_partial_index(db_path: Path) -> None:
    with Store(db_path) as store:
        plan = store.query("EXPLAIN QUERY PLAN SELECT * FROM events WHERE retry = 1 ORDER BY id DESC LIMIT 8")
        assert any("events_retries" in row["detail"] for row in plan), plan
        indexes = {r["name"] for r in store.query("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "events_retry" not in indexes  # the old LIKE index is gone
