"""Migration m002_crash_loop."""

from __future__ import annotations

import sqlite_utils

NAME = "m002_crash_loop"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # The suite's crash-loop guard, stored with each job like hang_timeout_s. Jobs queued before
    # the setting existed keep the values the guard had then: 3 failures within 30 s in 300 s.
    # crash_loop_failures = 0 switches the guard off for that job's suite.
    for statement in (
        "ALTER TABLE jobs ADD COLUMN crash_loop_failures INTEGER NOT NULL DEFAULT 3",
        "ALTER TABLE jobs ADD COLUMN crash_loop_within_s REAL NOT NULL DEFAULT 30",
        "ALTER TABLE jobs ADD COLUMN crash_loop_window_s REAL NOT NULL DEFAULT 300",
    ):
        db.execute(statement)
