"""Migration m020_attempt_containment."""

from __future__ import annotations

import sqlite_utils

NAME = "m020_attempt_containment"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # `hunted`: processes of an attempt that had to be found and ended outside its process
    # group (setsid, double fork), in one line for `orch show`: how many, which, how found.
    # `token`: random per attempt, given to its wrapper and worker (ORCH_ATTEMPT_TOKEN); an
    # exit.json (and, from our workers, a result.json) without it is not this attempt's.
    db.execute("ALTER TABLE attempts ADD COLUMN hunted TEXT")
    db.execute("ALTER TABLE attempts ADD COLUMN token TEXT")
