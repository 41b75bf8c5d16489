"""Migration m008_memory_learning."""

from __future__ import annotations

import sqlite_utils

NAME = "m008_memory_learning"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # Shapes keyed by memory-relevant keys only; a suite's `memory_keys` (JSON list) and
    # `min_stack_gain` (NULL: stack up to the plan) are stored with each job. A shape row names
    # the suite and config that last taught it, so `orch memory forget --suite S` can find it.
    # Throughput: samples/s per GPU, shape and number of jobs on the card, learned while running.
    for statement in (
        "ALTER TABLE jobs ADD COLUMN memory_keys_json TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE jobs ADD COLUMN min_stack_gain REAL",
        "ALTER TABLE memory_shapes ADD COLUMN suite TEXT",
        "ALTER TABLE memory_shapes ADD COLUMN label TEXT",
        """
        CREATE TABLE throughput (
            gpu_uuid TEXT NOT NULL,
            shape_key TEXT NOT NULL,
            tenants INTEGER NOT NULL,       -- attempts on the card, this one included
            samples_per_s REAL NOT NULL,    -- running mean of one attempt's rate at that count
            samples INTEGER NOT NULL,
            suite TEXT,
            updated_at REAL NOT NULL,
            PRIMARY KEY (gpu_uuid, shape_key, tenants)
        )
        """,
    ):
        db.execute(statement)
