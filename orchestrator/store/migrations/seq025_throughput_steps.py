"""Migration m027_throughput_steps."""

from __future__ import annotations

import sqlite_utils

NAME = "m027_throughput_steps"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # A throughput reading counts the optimizer steps it rests on (a curve point needs enough of
    # them) and the lowest and highest rate folded into it (`orch memory` shows the spread).
    # Rows written before have 0 steps: they no longer shape a curve until measured again.
    for statement in (
        "ALTER TABLE throughput ADD COLUMN steps INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE throughput ADD COLUMN rate_min REAL",
        "ALTER TABLE throughput ADD COLUMN rate_max REAL",
    ):
        db.execute(statement)
