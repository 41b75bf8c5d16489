"""Migration m063_attempt_trial_fence."""

from __future__ import annotations

import sqlite_utils

NAME = "m063_attempt_trial_fence"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # A start on trial (under --mps): the attempt was started into less room than its prediction
    # asked, at least the least it could need, and fenced by MPS at that room (MiB). An OOM under
    # that fence is orch's gamble: the job is requeued at the same level, not counted. NULL: an
    # ordinary start.
    db.execute("ALTER TABLE attempts ADD COLUMN trial_fence_mib INTEGER")
