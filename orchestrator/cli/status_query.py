"""The data behind `orch status`: one read of state.db into a plain dict (also the --json shape)."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.daemon_state import daemon_alive
from orchestrator.plans import DEFAULT_SLOTS
from orchestrator.resources import attempt_uuids, held_by_gpu
from orchestrator.store.db import Store, now_s
from orchestrator.store.jobs import get_gpu_plan
from orchestrator.store.queries import iter_status_jobs, state_counts
from orchestrator.store.resources import read_host_reading

RECENT_EVENTS = 12
FIRST_WAITING = 6


def status_snapshot(store: Store, *, all_jobs: bool = True) -> dict[str, Any]:
    daemon = daemon_alive(store)
    daemon_row = store.query("SELECT gpus_json, heartbeat_at, disk_json FROM daemon WHERE id = 1")
    gpus_raw = json.loads(daemon_row[0]["gpus_json"]) if daemon_row and daemon_row[0]["gpus_json"] else []
    plan = get_gpu_plan(store)
    live = store.query(
        "SELECT a.*, j.suite, j.config_name, j.seed, j.data FROM attempts a JOIN jobs j ON j.id = a.job_id "
        "WHERE a.outcome IS NULL ORDER BY a.gpu_index, a.id"
    )
    gpus: list[dict[str, Any]] = []
    for g in gpus_raw:
        on_gpu = [a for a in live if g["uuid"] in attempt_uuids(a)]  # every rank of a gang counts
        orch_mib = sum(held_by_gpu(a).get(g["uuid"], a["held_mib"] or 0) for a in on_gpu)
        gpus.append(
            {
                "index": g["index"],
                "uuid": g["uuid"],
                "name": g["name"],
                "total_mib": g["total_mib"],
                "used_mib": g["used_mib"],
                "orch_mib": orch_mib,
                "foreign_mib": max(0, g["used_mib"] - orch_mib),
                "free_mib": g["free_mib"],
                "utilization_pct": g.get("utilization_pct"),
                "slots": plan.slots_for(g["index"], DEFAULT_SLOTS),
                "running": len(on_gpu),
            }
        )
    running = [
        {
            "id": a["job_id"],
            "suite": a["suite"],
            "config": a["config_name"],
            "seed": a["seed"],
            "data": a["data"],
            "gpu": a["gpu_index"],
            "attempt": a["n"],
            "level": a["level"],
            "elapsed_s": now_s() - a["started_at"],
            "held_mib": a["held_mib"],
            "predicted_mib": a["predicted_peak_mib"],
            "progress": json.loads(a["progress_json"]) if a["progress_json"] else None,
            "executor": a.get("executor") or a.get("launcher"),
            "executor_id": a.get("executor_id"),
            "executor_state": a.get("executor_state"),  # Slurm: e.g. "PENDING (Resources)"
        }
        for a in live
    ]
    waiting = store.query(
        "SELECT id, suite, config_name, wait_reason FROM jobs WHERE state = 'queued' "
        "ORDER BY priority DESC, id LIMIT ?", [FIRST_WAITING]
    )
    retries = store.query(
        "SELECT ts, job_id, data_json, message FROM events WHERE data_json LIKE '%\"retry\"%' ORDER BY id DESC LIMIT 8"
    )
    events = store.query("SELECT ts, job_id, kind, message FROM events ORDER BY id DESC LIMIT ?", [RECENT_EVENTS])
    jobs = list(iter_status_jobs(store)) if all_jobs else []
    return {
        "db": str(store.path),
        "daemon": {
            "alive": daemon is not None,
            "pid": daemon["pid"] if daemon else None,
            "draining": bool(daemon["draining"]) if daemon else False,
            "last_tick_age_s": (now_s() - daemon_row[0]["heartbeat_at"]) if daemon_row and daemon_row[0]["heartbeat_at"] else None,
        },
        "gpus": gpus,
        "host": host_summary(read_host_reading(store)),
        # the runs dir's free space as the daemon last read it: {path, free_mib, min_free_mib,
        # warn_free_mib, level: ok|low|full}; null before a daemon has run
        "disk": json.loads(daemon_row[0]["disk_json"]) if daemon_row and daemon_row[0]["disk_json"] else None,
        "counts": state_counts(store),
        "running": running,
        "waiting": [{"id": w["id"], "suite": w["suite"], "config": w["config_name"], "reason": w["wait_reason"]} for w in waiting],
        "paused_suites": store.query(
            "SELECT p.suite, p.reason, p.paused_at, (SELECT COUNT(*) FROM jobs j WHERE j.suite = p.suite "
            "AND j.state = 'queued') AS queued FROM paused_suites p ORDER BY p.suite"
        ),
        "retries": [
            {"ts": r["ts"], "job": r["job_id"], **json.loads(r["data_json"])["retry"]} for r in retries
        ],
        "events": [{"ts": e["ts"], "job": e["job_id"], "kind": e["kind"], "message": e["message"]} for e in reversed(events)],
        "jobs": jobs,
    }


def host_summary(reading: dict[str, Any] | None) -> dict[str, Any] | None:
    """Host RAM as `orch status` shows it: ours (our attempts' trees), others, free; None
    before a daemon has read it."""
    if reading is None:
        return None
    try:
        total, available, ours = int(reading["total_mib"]), int(reading["available_mib"]), int(reading["ours_mib"])
    except (KeyError, TypeError, ValueError):
        return None
    return {
        "total_mib": total, "ours_mib": ours, "others_mib": max(0, total - available - ours),
        "free_mib": available, "reserve_mib": int(reading.get("reserve_mib") or 0),
    }
