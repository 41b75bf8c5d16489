"""Migration m026_metric_history."""

from __future__ import annotations

import sqlite_utils

NAME = "m026_metric_history"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # Every metric an attempt reported, at its step (progress.jsonl, parsed stdout, the final
    # metrics), for curves and their export. One value per (attempt, key, step), the last read
    # winning, so reading a file again after a daemon restart changes nothing; a key's history
    # beyond its cap is downsampled (store.history), keeping minima and maxima.
    db.execute(  # one statement, not executescript: that would commit the migration's transaction
        """
        CREATE TABLE metric_history (
            attempt_id INTEGER NOT NULL REFERENCES attempts(id) ON DELETE CASCADE,
            key TEXT NOT NULL,
            step REAL NOT NULL,
            value REAL NOT NULL,
            PRIMARY KEY (attempt_id, key, step)
        ) WITHOUT ROWID
        """
    )
