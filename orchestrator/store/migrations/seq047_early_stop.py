"""Migration m047_early_stop."""

from __future__ import annotations

import sqlite_utils

NAME = "m047_early_stop"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # `early_stop_json`: the suite's validated `early_stop:` rule, stored with each job ('{}': none).
    # `pruned_json`: why early stopping stopped the job's setting (step, metric, value, rank);
    # kept after an `orch retry`, which exempts the setting from further pruning.
    # `early_stop_rungs`: the pruner's record of each setting's value at each rung it reached
    # (Optuna's completed-rung attributes), read back after a daemon restart so that no setting is
    # judged twice at a rung.
    for statement in (
        "ALTER TABLE jobs ADD COLUMN early_stop_json TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE jobs ADD COLUMN pruned_json TEXT",
        """
        CREATE TABLE early_stop_rungs (
            suite TEXT NOT NULL,
            data TEXT NOT NULL,
            setting TEXT NOT NULL,
            rung INTEGER NOT NULL,
            step REAL NOT NULL,
            value REAL NOT NULL,
            PRIMARY KEY (suite, data, setting, rung)
        )
        """,
    ):
        db.execute(statement)
