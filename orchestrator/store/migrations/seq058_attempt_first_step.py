"""Migration m058_attempt_first_step."""

from __future__ import annotations

import sqlite_utils

NAME = "m058_attempt_first_step"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # The first training step the daemon saw an attempt report, and when (wall clock, as
    # last_progress_at): its own pace is read from the steps after it, for start-up overlap.
    # NULL: not seen yet, or seen before this column existed.
    db.execute("ALTER TABLE attempts ADD COLUMN first_step INTEGER")
    db.execute("ALTER TABLE attempts ADD COLUMN first_step_at REAL")
