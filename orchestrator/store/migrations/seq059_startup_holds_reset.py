"""Migration m059_startup_holds_reset."""

from __future__ import annotations

import sqlite_utils

NAME = "m059_startup_holds_reset"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # Start-ups learned before a hold was read until shortly before the first step: their holds
    # were the last reading before it, often the first step's whole peak (a trainer that reports
    # the step after it), and the most held is now kept, so such a hold would never come down.
    # They are learned again from the next attempts.
    db.execute("DELETE FROM startups")
