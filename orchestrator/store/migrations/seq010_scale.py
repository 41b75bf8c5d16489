"""Migration m010_scale."""

from __future__ import annotations

import sqlite_utils

NAME = "m010_scale"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # Reads that must not scan a queue of 100,000 jobs: the head of the queue in order, a job's
    # attempts, succeeded attempts by end time (the run-time table is read incrementally), and
    # the latest retry events (a partial index over exactly the dashboard's filter).
    for statement in (
        "CREATE INDEX jobs_queue_order ON jobs(state, priority DESC, id)",
        "CREATE INDEX attempts_job ON attempts(job_id, n)",
        "CREATE INDEX attempts_ended ON attempts(outcome, ended_at)",
        "CREATE INDEX events_retry ON events(id) WHERE data_json LIKE '%\"retry\"%'",
    ):
        db.execute(statement)
