"""Migration m023_attempt_inexact_rungs."""

from __future__ import annotations

import sqlite_utils

NAME = "m023_attempt_inexact_rungs"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # The rungs that change numerics an attempt went through (a JSON list of names, in ladder
    # order), decided when it starts; results mark every cell with such a run. NULL: recorded
    # before this column (results fall back to the level's recorded changes).
    db.execute("ALTER TABLE attempts ADD COLUMN inexact_rungs_json TEXT")
