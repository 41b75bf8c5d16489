"""Migration m057_fused_caps."""

from __future__ import annotations

import sqlite_utils

NAME = "m057_fused_caps"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # A suite's cap on fused group size after a group ran out of memory (N members: the cap
    # becomes max(1, N // 2)); below the suite's own `fused_members`. Kept across daemon restarts.
    db.execute(
        "CREATE TABLE fused_caps (suite TEXT PRIMARY KEY, cap INTEGER NOT NULL, "
        "lowered_at REAL NOT NULL, reason TEXT NOT NULL)"
    )
