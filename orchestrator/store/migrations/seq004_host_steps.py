"""Migration m004_host_steps."""

from __future__ import annotations

import sqlite_utils

NAME = "m004_host_steps"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # Host-side steps (fewer data workers, running alone) a job took after host-RAM OOMs, as a
    # JSON list; every later attempt keeps them on top of its ladder level.
    db.execute("ALTER TABLE jobs ADD COLUMN host_steps_json TEXT NOT NULL DEFAULT '[]'")
