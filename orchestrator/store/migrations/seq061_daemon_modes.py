"""Migration m061_daemon_modes."""

from __future__ import annotations

import sqlite_utils

NAME = "m061_daemon_modes"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # `modes_json`: the opt-in ways of running the daemon registered with (["overlap", "mps"]), so
    # `orch status` and `orch daemon status` say how it places jobs; NULL before this column.
    db.execute("ALTER TABLE daemon ADD COLUMN modes_json TEXT")
