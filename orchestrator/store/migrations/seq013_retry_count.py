"""Migration m013_retry_count."""

from __future__ import annotations

import sqlite_utils

NAME = "m013_retry_count"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # A move down the ladder is a column, not a string searched for in the events' JSON: the
    # event that records it has retry = 1, written with it; the dashboard's retries panel reads
    # those through a partial index. Here the events so far are marked.
    for statement in (
        "ALTER TABLE events ADD COLUMN retry INTEGER NOT NULL DEFAULT 0",
        "UPDATE events SET retry = 1 WHERE data_json LIKE '%\"retry\"%' AND json_valid(data_json) "
        "AND json_type(data_json, '$.retry') = 'object'",
        "DROP INDEX IF EXISTS events_retry",
        "CREATE INDEX events_retries ON events(id) WHERE retry = 1",
    ):
        db.execute(statement)
