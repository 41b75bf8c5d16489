"""Migration m022_start_level_notes."""

from __future__ import annotations

import sqlite_utils

NAME = "m022_start_level_notes"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # Why a job starts (or goes on) above the level its ladder would give it: the level it was
    # at is known not to fit any card it may use ("started at level 2: level 0 needs ≥ 24.6
    # GiB, the cards hold 24 GiB"). NULL: it runs where the ladder put it.
    db.execute("ALTER TABLE jobs ADD COLUMN level_note TEXT")
