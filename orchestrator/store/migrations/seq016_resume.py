"""Migration m016_resume."""

from __future__ import annotations

import sqlite_utils

NAME = "m016_resume"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # An attempt after a death may continue from a checkpoint an earlier attempt of its job left
    # in its run dir: which attempt (its n) and which checkpoint (the folder's path).
    for statement in (
        "ALTER TABLE attempts ADD COLUMN resumed_from_attempt INTEGER",
        "ALTER TABLE attempts ADD COLUMN resumed_from_checkpoint TEXT",
    ):
        db.execute(statement)
