"""Migration m056_attempt_share."""

from __future__ import annotations

import sqlite_utils

NAME = "m056_attempt_share"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # What a live attempt's share.json said (written by the LoRA worker's client once a warm
    # process took its job, `share_base`): the process that trains it (`<key16>-<slot>`) and its
    # pid, sequential or fused, and the base's resident MiB where the worker measured it. Read
    # untrusted, checked, at observation: `orch status` shows which jobs share a process, the
    # crash-loop guard counts one process's death once, and placement joins a fused group.
    # NULL: none read (a job in a process of its own, or none written yet).
    db.execute("ALTER TABLE attempts ADD COLUMN share_mode TEXT")
    db.execute("ALTER TABLE attempts ADD COLUMN share_process TEXT")
    db.execute("ALTER TABLE attempts ADD COLUMN share_pid INTEGER")
    db.execute("ALTER TABLE attempts ADD COLUMN share_base_mib INTEGER")
