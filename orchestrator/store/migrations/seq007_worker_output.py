"""Migration m007_worker_output."""

from __future__ import annotations

import sqlite_utils

NAME = "m007_worker_output"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # What the daemon needs to drive and read a suite's own script, stored with each job as JSON:
    # `keys` (ladder knobs under the script's names), `progress_regex`, `result_regex`. And the
    # metrics parsed from an attempt's stdout when it wrote no result.json.
    db.execute("ALTER TABLE jobs ADD COLUMN worker_output_json TEXT NOT NULL DEFAULT '{}'")
    db.execute("ALTER TABLE attempts ADD COLUMN output_metrics_json TEXT")
