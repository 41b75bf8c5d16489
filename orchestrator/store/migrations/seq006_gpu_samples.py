"""Migration m006_gpu_samples."""

from __future__ import annotations

import sqlite_utils

NAME = "m006_gpu_samples"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # Each GPU's memory over time (ours vs foreign vs free) for the web page and the report.
    # The daemon writes a row per GPU every few seconds; the table is kept bounded by thinning
    # its older rows (store.gpu_samples), so a sweep of weeks stays small.
    db.execute(  # one statement, not executescript: that would commit the migration's transaction
        """
        CREATE TABLE gpu_samples (
            id INTEGER PRIMARY KEY,
            ts REAL NOT NULL,
            gpu_index INTEGER NOT NULL,
            gpu_uuid TEXT NOT NULL,
            total_mib INTEGER NOT NULL,
            used_mib INTEGER NOT NULL,
            orch_mib INTEGER NOT NULL,
            free_mib INTEGER NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX gpu_samples_gpu ON gpu_samples(gpu_uuid, id)")
