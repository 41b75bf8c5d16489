"""Migration m025_run_evidence."""

from __future__ import annotations

import sqlite_utils

NAME = "m025_run_evidence"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # What results must say about a run beside its scores: `loss_json`, the loss summary its end
    # was judged on (first steps, minimum, last epoch); `diverged`, why the divergence rule flagged
    # it (NULL: not flagged or nothing known); `provenance_json`, the validated digest of its
    # provenance.json (code commit and dirty flag, library versions, GPU, host, data and model).
    for statement in (
        "ALTER TABLE attempts ADD COLUMN loss_json TEXT",
        "ALTER TABLE attempts ADD COLUMN diverged TEXT",
        "ALTER TABLE attempts ADD COLUMN provenance_json TEXT",
    ):
        db.execute(statement)
