"""Migration m062_attempt_fuse_process."""

from __future__ import annotations

import sqlite_utils

NAME = "m062_attempt_fuse_process"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # `share_base: fused`: the warm process the daemon placed the attempt in, named by the id of
    # the attempt whose placement opened it (its own where it opened one). The attempt's client
    # joins only a process of that name (ORCH_FUSE_PROCESS), so the groups that train are the ones
    # placement counted and balanced. NULL: not a fused member, or placed before this column.
    db.execute("ALTER TABLE attempts ADD COLUMN fuse_process INTEGER")
