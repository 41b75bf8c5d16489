"""Migration m014_queue_changes."""

from __future__ import annotations

import sqlite_utils

NAME = "m014_queue_changes"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # Which queued jobs changed, for a daemon that keeps the queue between passes: every insert,
    # update or delete of a row that is or was queued logs its id, whoever wrote it (a submit,
    # a cancel, a priority change, the daemon's own claims). The daemon reads the log from
    # where it last read and re-reads only those rows; AUTOINCREMENT keeps the numbering
    # rising after it deletes what it has read.
    for statement in (
        "CREATE TABLE queue_changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL)",
        "CREATE TRIGGER queue_changes_insert AFTER INSERT ON jobs WHEN NEW.state = 'queued' "
        "BEGIN INSERT INTO queue_changes (job_id) VALUES (NEW.id); END",
        "CREATE TRIGGER queue_changes_update AFTER UPDATE ON jobs "
        "WHEN OLD.state = 'queued' OR NEW.state = 'queued' "
        "BEGIN INSERT INTO queue_changes (job_id) VALUES (NEW.id); END",
        "CREATE TRIGGER queue_changes_delete AFTER DELETE ON jobs WHEN OLD.state = 'queued' "
        "BEGIN INSERT INTO queue_changes (job_id) VALUES (OLD.id); END",
    ):
        db.execute(statement)
