"""Migration m001_initial: the tables as first created."""

from __future__ import annotations

import sqlite_utils

from orchestrator.store.initial_tables import INITIAL_TABLES_SQL

NAME = "m001_initial"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    db.executescript(INITIAL_TABLES_SQL)
