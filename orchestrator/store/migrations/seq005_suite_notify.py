"""Migration m005_suite_notify."""

from __future__ import annotations

import sqlite_utils

NAME = "m005_suite_notify"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # A suite's `notify:` URLs, as of its latest submit, for the daemon's notifications.
    db.execute(  # one statement, not executescript: that would commit the migration's transaction
        """
        CREATE TABLE suite_notify (
            suite TEXT PRIMARY KEY,
            urls_json TEXT NOT NULL,
            updated_at REAL NOT NULL
        )
        """
    )
