"""Migration m017_gpu_sample_holds."""

from __future__ import annotations

import sqlite_utils

NAME = "m017_gpu_sample_holds"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # What each job held in a memory sample ({job id: MiB} on that GPU), so the web page's memory
    # chart can split "ours" per job. NULL in rows written before: those show ours as one band.
    db.execute("ALTER TABLE gpu_samples ADD COLUMN holds_json TEXT")
