"""Migration m009_untrusted_files."""

from __future__ import annotations

import sqlite_utils

NAME = "m009_untrusted_files"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # The runs dir's free space as the daemon last read it ({path, free_mib, min_free_mib,
    # warn_free_mib, level}), so `orch status` can say the disk is full without a daemon call.
    db.execute("ALTER TABLE daemon ADD COLUMN disk_json TEXT")
