"""Read-only queries for the CLI and the dashboard. Nothing here writes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.errors import JobNotFound
from orchestrator.lifecycle import JobState
from orchestrator.store.db import Store

_JOB_LIST_SQL = """
SELECT j.id, j.state, j.suite, j.config_name, j.seed, j.data, j.priority, j.level,
       j.attempt_count, j.wait_reason, j.reason, j.created_at, j.updated_at,
       a.gpu_index AS gpu, a.started_at AS attempt_started_at, a.held_mib, a.peak_mib,
       a.progress_json, a.id AS attempt_id
FROM jobs j
LEFT JOIN attempts a ON a.job_id = j.id AND a.outcome IS NULL
"""


def job_row_to_public(row: dict[str, Any]) -> dict[str, Any]:
    """The documented `--json` shape of one job in lists."""
    return {
        "id": row["id"],
        "state": row["state"],
        "suite": row["suite"],
        "config": row["config_name"],
        "seed": row["seed"],
        "data": row["data"],
        "gpu": row["gpu"],
        "attempt": row["attempt_count"],
        "level": row["level"],
        "priority": row["priority"],
        "wait_reason": row["wait_reason"],
        "reason": row["reason"],
    }


def _job_list_sql(
    state: str | None, suite: str | None, limit: int | None, offset: int
) -> tuple[str, list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if state is not None:
        where.append("j.state = ?")
        params.append(state)
    if suite is not None:
        where.append("j.suite = ?")
        params.append(suite)
    sql = _JOB_LIST_SQL + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY j.id"
    if limit is not None or offset:
        sql += " LIMIT ? OFFSET ?"
        params += [-1 if limit is None else int(limit), int(offset)]
    return sql, params


def list_jobs(
    store: Store, *, state: str | None = None, suite: str | None = None, limit: int | None = None,
    offset: int = 0,
) -> list[dict[str, Any]]:
    return store.query(*_job_list_sql(state, suite, limit, offset))


def iter_jobs(
    store: Store, *, state: str | None = None, suite: str | None = None, limit: int | None = None,
    offset: int = 0,
) -> Iterator[dict[str, Any]]:
    """`list_jobs`, streamed from a cursor (for output of any length in flat memory)."""
    return store.iter_query(*_job_list_sql(state, suite, limit, offset))


def iter_status_jobs(store: Store, *, limit: int | None = None, offset: int = 0) -> Iterator[dict[str, Any]]:
    """Every job in the `orch status --json` shape, by id, streamed."""
    sql = (
        "SELECT j.id, j.state, j.suite, j.config_name, j.seed, j.data, j.attempt_count, j.level, a.gpu_index "
        "FROM jobs j LEFT JOIN attempts a ON a.job_id = j.id AND a.outcome IS NULL ORDER BY j.id"
    )
    params: list[Any] = []
    if limit is not None or offset:
        sql += " LIMIT ? OFFSET ?"
        params = [-1 if limit is None else int(limit), int(offset)]
    for j in store.iter_query(sql, params):
        yield {
            "id": j["id"], "state": j["state"], "suite": j["suite"], "config": j["config_name"],
            "seed": j["seed"], "data": j["data"], "gpu": j["gpu_index"], "attempt": j["attempt_count"],
            "level": j["level"],
        }


def state_counts(store: Store) -> dict[str, int]:
    counts = {s.value: 0 for s in JobState}
    for row in store.query("SELECT state, count(*) AS n FROM jobs GROUP BY state"):
        counts[row["state"]] = row["n"]
    return counts


def get_job(store: Store, job_id: int) -> dict[str, Any]:
    rows = store.query("SELECT * FROM jobs WHERE id = ?", [job_id])
    if not rows:
        raise JobNotFound(f"no job {job_id} (see `orch jobs`)")
    return rows[0]


def get_attempts(store: Store, job_id: int) -> list[dict[str, Any]]:
    return store.query("SELECT * FROM attempts WHERE job_id = ? ORDER BY n", [job_id])


def get_events(store: Store, job_id: int | None = None, limit: int = 200) -> list[dict[str, Any]]:
    if job_id is None:
        return store.query("SELECT * FROM events ORDER BY id DESC LIMIT ?", [limit])[::-1]
    return store.query("SELECT * FROM events WHERE job_id = ? ORDER BY id LIMIT ?", [job_id, limit])


def _json_or_none(text: Any) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _resources_public(row: dict[str, Any]) -> dict[str, Any]:
    """A multi-GPU attempt's cards, port and per-card / per-rank peaks; host RAM and CPU peaks."""
    return {
        "gpu_uuids": _json_or_none(row.get("gpu_uuids_json")) or [row["gpu_uuid"]],
        "port": row.get("port"),
        "peak_by_gpu_mib": _json_or_none(row.get("peak_by_gpu_json")),
        "peak_by_rank_mib": _json_or_none(row.get("peak_by_rank_json")),
        "host_peak_mib": row.get("host_peak_mib"),
        "cpu_peak_cores": row.get("cpu_peak_cores"),
    }


def attempt_to_public(row: dict[str, Any]) -> dict[str, Any]:
    """The documented `--json` shape of one attempt."""
    run_dir = row["run_dir"]
    return {
        "n": row["n"],
        "gpu": row["gpu_index"],
        "gpu_uuid": row["gpu_uuid"],
        "level": row["level"],
        "step": row["level_step"],
        "outcome": row["outcome"],
        "exit_code": row["exit_code"],
        "signal": row["signal"],
        "reason": row["reason"],
        "peak_mib": row["peak_mib"],
        **_resources_public(row),
        "predicted_peak_mib": row["predicted_peak_mib"],
        "prediction_source": row["prediction_source"],
        "started_at": row["started_at"],
        "ended_at": row["ended_at"],
        "run_dir": run_dir,
        "log": str(Path(run_dir) / "stdout.log"),
        "overrides": json.loads(row["overrides_json"] or "{}"),
        "changes": json.loads(row["changes_json"] or "{}"),
        "run_alone": bool(row["run_alone"]),
        "executor": row.get("executor") or row.get("launcher"),
        "executor_id": row.get("executor_id"),  # a Slurm job id, a tmux window id
    }


def job_to_public(job: dict[str, Any], attempts: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    live = next((a for a in attempts if a["outcome"] is None), None)
    return {
        "id": job["id"],
        "state": job["state"],
        "suite": job["suite"],
        "config": job["config_name"],
        "config_path": job["config_path"],
        "seed": job["seed"],
        "data": job["data"],
        "worker": job["worker"],
        "priority": job["priority"],
        "level": job["level"],
        "attempt": job["attempt_count"],
        "max_attempts": job["max_attempts"],
        "gpu": live["gpu_index"] if live else None,
        "declared_mib": job["declared_mib"],
        "allowed_gpus": json.loads(job["allowed_gpus_json"]) if job["allowed_gpus_json"] else None,
        "overrides": json.loads(job["overrides_json"]),
        "config_content": json.loads(job["config_json"]),
        "wait_reason": job["wait_reason"],
        "reason": job["reason"],
        "identity": job["identity"],
        "created_at": job["created_at"],
        "updated_at": job["updated_at"],
        "attempts": [attempt_to_public(a) for a in attempts],
        "events": [
            {
                "ts": e["ts"],
                "kind": e["kind"],
                "from": e["from_state"],
                "to": e["to_state"],
                "message": e["message"],
                "data": json.loads(e["data_json"]) if e["data_json"] else None,
            }
            for e in events
        ],
    }


def last_seen_gpu_indices(store: Store) -> list[int] | None:
    """The GPU indices of the daemon's last reading (None when no daemon has read any)."""
    rows = store.query("SELECT gpus_json FROM daemon WHERE id = 1")
    if not rows or not rows[0]["gpus_json"]:
        return None
    try:
        gpus = json.loads(rows[0]["gpus_json"])
        return sorted(int(g["index"]) for g in gpus)
    except (ValueError, TypeError, KeyError):
        return None


def suite_names(store: Store) -> list[str]:
    """Every suite that has jobs in this state.db."""
    return [r["suite"] for r in store.query("SELECT DISTINCT suite FROM jobs ORDER BY suite")]
