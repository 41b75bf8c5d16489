"""Reads behind one scheduling pass, shaped so that a long queue costs little per pass: the
queue's light columns, the heavy ones only for jobs the scheduler has not seen, and run times
of attempts that succeeded since the last read."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from orchestrator.store.db import Store

# What a pass needs of every queued job; config, ladder and env are read once per job.
QUEUED_COLUMNS = (
    "id, suite, priority, level, host_steps_json, queued_at, allowed_gpus_json, config_name, data, "
    "wait_reason, worker, declared_mib, min_stack_gain"
)
_IN_CHUNK = 500  # host parameters per IN (...) list, well below SQLite's limit


def queued_jobs(store: Store, limit: int | None = None) -> list[dict[str, Any]]:
    """Queued jobs in queue order (priority, then submission), light columns only."""
    sql = f"SELECT {QUEUED_COLUMNS} FROM jobs WHERE state = 'queued' ORDER BY priority DESC, id"
    if limit is not None:
        return store.query(sql + " LIMIT ?", [int(limit)])
    return store.query(sql)


def jobs_by_id(store: Store, job_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """Whole job rows for these ids."""
    ids = list(job_ids)
    rows: dict[int, dict[str, Any]] = {}
    for start in range(0, len(ids), _IN_CHUNK):
        chunk = ids[start : start + _IN_CHUNK]
        marks = ",".join("?" * len(chunk))
        for row in store.query(f"SELECT * FROM jobs WHERE id IN ({marks})", chunk):
            rows[row["id"]] = row
    return rows


def succeeded_runs_since(store: Store, ended_at_s: float | None) -> list[dict[str, Any]]:
    """Succeeded attempts that ended at or after `ended_at_s` (all when None), with their
    config, data and level: the run-time table is built from these."""
    sql = (
        "SELECT a.id, j.config_name, j.data, a.level, a.ended_at, a.ended_at - a.started_at AS duration_s"
        " FROM attempts a JOIN jobs j ON j.id = a.job_id"
        " WHERE a.outcome = 'succeeded' AND a.ended_at IS NOT NULL"
    )
    if ended_at_s is None:
        return store.query(sql)
    return store.query(sql + " AND a.ended_at >= ?", [ended_at_s])


def live_attempt_rows(store: Store) -> list[dict[str, Any]]:
    return store.query("SELECT * FROM attempts WHERE outcome IS NULL")


def paused_suites(store: Store) -> dict[str, str]:
    return {r["suite"]: r["reason"] for r in store.query("SELECT suite, reason FROM paused_suites")}
