"""Migration m022_disproved_figures."""

from __future__ import annotations

import sqlite_utils

NAME = "m022_disproved_figures"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # The most an OOM'd attempt of a shape was placed at: that figure is disproved, and no later
    # attempt of its jobs, at any ladder level, is predicted at or below it. NULL: no OOM placed.
    db.execute("ALTER TABLE memory_shapes ADD COLUMN disproved_mib INTEGER")
