"""Migration m019_resume_boundaries."""

from __future__ import annotations

import sqlite_utils

NAME = "m019_resume_boundaries"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # A resume never crosses a change of worker command (each attempt records the one it ran;
    # NULL in rows written before) nor an `orch retry --fresh` (attempts up to n are not resumed).
    for statement in (
        "ALTER TABLE attempts ADD COLUMN worker TEXT",
        "ALTER TABLE jobs ADD COLUMN fresh_after_attempt INTEGER NOT NULL DEFAULT 0",
    ):
        db.execute(statement)
