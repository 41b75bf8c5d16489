"""Migration m055_attempt_sm_pct."""

from __future__ import annotations

import sqlite_utils

NAME = "m055_attempt_sm_pct"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # A live attempt's share of its GPU's streaming multiprocessors now (NVML's per-process
    # utilisation, its tree's processes summed; the busiest card of a multi-GPU job), as the
    # daemon last read it: `orch status` shows it beside the card's. NULL: not known (no NVML
    # per-process figures, simulated GPUs, not read yet).
    db.execute("ALTER TABLE attempts ADD COLUMN sm_pct INTEGER")
