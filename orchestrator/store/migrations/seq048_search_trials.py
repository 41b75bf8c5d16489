"""Migration m048_search_trials."""

from __future__ import annotations

import sqlite_utils

NAME = "m048_search_trials"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # `search_json`: the job's place in its suite's `search:` ('{}': none): the checked search
    # spec, the trial number and the suite's max_attempts; a TPE search's daemon counts trials by it.
    db.execute("ALTER TABLE jobs ADD COLUMN search_json TEXT NOT NULL DEFAULT '{}'")
