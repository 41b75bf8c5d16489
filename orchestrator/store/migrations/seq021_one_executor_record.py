"""Migration m021_one_executor_record."""

from __future__ import annotations

import sqlite_utils

NAME = "m021_one_executor_record"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # An attempt's executor and its id there are kept once: `executor`/`executor_id` take over
    # what `launcher`/`window_id` held for rows written before m011 (a tmux window id is the
    # tmux executor's id). Nothing reads or writes the old pair from here on. They stay in the
    # table: a daemon of an earlier orch, still running while a newer `orch` migrates its
    # state.db, writes them at every launch, and would lose its workers' records without them.
    db.execute(
        "UPDATE attempts SET executor = launcher WHERE executor IS NULL AND launcher IS NOT NULL"
    )
    db.execute(
        "UPDATE attempts SET executor_id = window_id WHERE executor_id IS NULL AND window_id IS NOT NULL"
    )
