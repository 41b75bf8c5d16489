"""Migration m011_executors."""

from __future__ import annotations

import sqlite_utils

NAME = "m011_executors"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # Where an attempt runs: the executor that owns it ("tmux", "subprocess", "slurm") and its
    # opaque id there (a tmux window id, a Slurm job id); and, per job, the suite's `slurm:`
    # settings (validated at submit) and Slurm's word on a waiting attempt (pending reason).
    for statement in (
        "ALTER TABLE attempts ADD COLUMN executor TEXT",
        "ALTER TABLE attempts ADD COLUMN executor_id TEXT",
        "ALTER TABLE attempts ADD COLUMN executor_state TEXT",
        "ALTER TABLE jobs ADD COLUMN slurm_json TEXT NOT NULL DEFAULT '{}'",
    ):
        db.execute(statement)
