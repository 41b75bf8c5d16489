"""Migration m060_early_stop_rung_rule."""

from __future__ import annotations

import json

import sqlite_utils

NAME = "m060_early_stop_rung_rule"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # `rule_json`: the early_stop rule a rung value was told under (its stored form, keys sorted).
    # A suite resubmitted with another rule (min_steps, metric, ...) judges its settings under the
    # new one; values told under the old one are other steps or another metric, and are not read.
    # Rows from before were told under the rule of their suite and task's newest job, the one the
    # daemon judged by.
    db.execute("ALTER TABLE early_stop_rungs ADD COLUMN rule_json TEXT NOT NULL DEFAULT ''")
    groups = db.execute("SELECT DISTINCT suite, data FROM early_stop_rungs").fetchall()
    for suite, data in groups:
        newest = db.execute(
            "SELECT early_stop_json FROM jobs WHERE suite = ? AND data = ? AND early_stop_json != '{}' "
            "ORDER BY id DESC LIMIT 1",
            [suite, data],
        ).fetchone()
        if newest is None:
            continue
        try:
            rule = json.loads(newest[0])
        except ValueError:
            continue
        db.execute(
            "UPDATE early_stop_rungs SET rule_json = ? WHERE suite = ? AND data = ?",
            [json.dumps(rule, sort_keys=True), suite, data],
        )
