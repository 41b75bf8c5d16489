"""Migration m003_prompt_lengths."""

from __future__ import annotations

import sqlite_utils

NAME = "m003_prompt_lengths"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # The longest prompt (tokens, after truncation) a finished LoRA run reported, per model,
    # data set and max_seq_len: estimates of other configs on the same data use it.
    db.execute(  # one statement, not executescript: that would commit the migration's transaction
        """
        CREATE TABLE prompt_lengths (
            length_key TEXT PRIMARY KEY,
            longest_tokens INTEGER NOT NULL,
            updated_at REAL NOT NULL
        )
        """
    )
