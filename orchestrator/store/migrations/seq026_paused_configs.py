"""Migration m029_paused_configs."""

from __future__ import annotations

import sqlite_utils

NAME = "m029_paused_configs"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # The crash-loop guard pauses the config whose attempts keep failing, not its whole suite:
    # the suite's healthy configs run on. The suite itself is paused (paused_suites) only once
    # every config with queued or running jobs is.
    db.execute(
        "CREATE TABLE paused_configs (suite TEXT NOT NULL, config_name TEXT NOT NULL, reason TEXT NOT NULL, "
        "paused_at REAL NOT NULL, PRIMARY KEY (suite, config_name))"
    )
