"""Migration m018_memory_families."""

from __future__ import annotations

import sqlite_utils

NAME = "m018_memory_families"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # Where a learned shape sits in its memory family (jobs whose received configs differ only in
    # batch size and sequence length): the family's fit predicts members never run. Rows learned
    # before this have none: they are not part of any family's fit.
    for statement in (
        "ALTER TABLE memory_shapes ADD COLUMN family_key TEXT",
        "ALTER TABLE memory_shapes ADD COLUMN batch_size INTEGER",
        "ALTER TABLE memory_shapes ADD COLUMN tokens INTEGER",
    ):
        db.execute(statement)
