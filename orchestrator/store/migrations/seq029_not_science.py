"""Migration m026_not_science."""

from __future__ import annotations

import sqlite_utils

NAME = "m026_not_science"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # A suite's `not_science:` keys as of the job's submit (a JSON list): config keys such as
    # output_dir or sim_seconds whose values never split results rows. '[]' for jobs before it.
    db.execute("ALTER TABLE jobs ADD COLUMN not_science_json TEXT NOT NULL DEFAULT '[]'")
