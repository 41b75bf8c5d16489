"""Migration m015_shape_teachers."""

from __future__ import annotations

import sqlite_utils

NAME = "m015_shape_teachers"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # Every suite that taught a shape, not only the last: `orch memory forget --suite S` must
    # find a shape that S taught and another suite taught after it.
    for statement in (
        "ALTER TABLE memory_shapes ADD COLUMN suites_json TEXT NOT NULL DEFAULT '[]'",
        "UPDATE memory_shapes SET suites_json = json_array(suite) WHERE suite IS NOT NULL",
    ):
        db.execute(statement)
