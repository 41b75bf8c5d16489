"""Store set-ups for tests: a state.db as an older orch left it (migrated up to just before one
migration), and an attempt plan with the usual values."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import sqlite_utils

from orchestrator.store.attempts import AttemptPlan
from orchestrator.store.migrations import MIGRATIONS
from orchestrator.store.peak_source import PredictionSource, SourceKind


def old_database_with_one_job(db_path: Path, stop_before: str) -> None:
    """Apply the migrations before `stop_before` and queue one job with the columns of m001."""
    conn = sqlite3.connect(str(db_path))
    MIGRATIONS.apply(sqlite_utils.Database(conn), stop_before=stop_before)
    conn.execute(
        "INSERT INTO jobs (identity, suite, config_name, config_path, config_json, seed, data, overrides_json, "
        "env_json, worker, declared_mib, state, max_attempts, hang_timeout_s, queued_at, created_at, updated_at) "
        "VALUES ('x', 'old', 'a', 'a.yaml', '{}', 1, 'task', '{}', '{}', 'sim', 1024, 'queued', 8, 1800, 0, 0, 0)"
    )
    conn.commit()
    conn.close()


def declared_plan(job_id: int, **more: Any) -> AttemptPlan:
    """An attempt plan at level 0 on GPU 0, predicted and reserved at the declared 1,024 MiB;
    `more`: its other fields (a resume's checkpoint, say)."""
    return AttemptPlan(job_id, 0, "GPU-0", 0, "base", {}, {}, False, 1024, PredictionSource(SourceKind.DECLARED),
                       1024, **more)
