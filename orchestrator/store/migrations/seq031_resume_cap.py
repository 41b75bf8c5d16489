"""Migration m031_resume_cap."""

from __future__ import annotations

import sqlite_utils

NAME = "m031_resume_cap"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # Deaths with a checkpoint left are requeued without using up max_attempts, but at most
    # `max_resumes` times (the suite's setting at submit; 8 for jobs before it); `resumes`
    # counts those requeues since the job was submitted or last retried by the user.
    for statement in (
        "ALTER TABLE jobs ADD COLUMN max_resumes INTEGER NOT NULL DEFAULT 8",
        "ALTER TABLE jobs ADD COLUMN resumes INTEGER NOT NULL DEFAULT 0",
    ):
        db.execute(statement)
