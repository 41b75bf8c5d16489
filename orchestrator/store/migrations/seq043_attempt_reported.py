"""Migration m043_attempt_reported."""

from __future__ import annotations

import sqlite_utils

NAME = "m043_attempt_reported"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # What an ended attempt reported for the results tables (attempts.reported.RunReading as
    # JSON: test and val metrics, test_is_val, LoRA dropout, best_step, error), read once from
    # its run dir when its end is recorded; NULL for attempts that ended before (results read
    # those from their run dirs).
    db.execute("ALTER TABLE attempts ADD COLUMN reported_json TEXT")
