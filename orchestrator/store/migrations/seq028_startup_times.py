"""Migration m027b_startup_times."""

from __future__ import annotations

import sqlite_utils

NAME = "m027b_startup_times"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # Launch to the first training step (the shortest seen) and the GPU memory held before it
    # (the least seen), per suite and config (`suite/config`): what start-up overlap needs to
    # start a job ahead of the one it replaces.
    db.execute(
        "CREATE TABLE startups (key TEXT PRIMARY KEY, seconds REAL NOT NULL, held_mib INTEGER NOT NULL, "
        "samples INTEGER NOT NULL, updated_at REAL NOT NULL)"
    )
