"""The data behind `orch status`: one read of state.db into a plain dict (also the --json shape)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from orchestrator.actions.presence import daemon_alive
from orchestrator.store.db import Store, now_s
from orchestrator.store.queries import iter_status_jobs, state_counts
from orchestrator.store.resources import read_host_reading
from orchestrator.store.sharing import share_labels
from orchestrator.store.status import (
    cards_now,
    daemon_reading,
    first_waiting,
    live_attempts,
    paused_configs,
    paused_suites,
    recent_events,
    recent_retries,
    waiting_groups,
)

RECENT_EVENTS = 12
FIRST_WAITING = 6
RECENT_RETRIES = 8
WAITING_GROUPS = 8


def status_snapshot(store: Store, *, all_jobs: bool = True) -> dict[str, Any]:
    daemon = daemon_alive(store)
    reading = daemon_reading(store)
    live = live_attempts(store)
    gpus: list[dict[str, Any]] = [
        {
            "index": card.index,
            "uuid": card.uuid,
            "name": card.name,
            "total_mib": card.total_mib,
            "used_mib": card.used_mib,
            "orch_mib": card.orch_mib,
            "foreign_mib": card.foreign_mib,
            "free_mib": card.free_mib,
            "utilization_pct": card.utilization_pct,
            "slots": card.slots,
            "running": card.running,  # every rank of a gang counts
            "slots_taken": card.slots_taken,  # a fused process's members take one slot
        }
        for card in cards_now(store, reading, live)
    ]
    shares = share_labels([la.attempt for la in live])
    running = [
        {
            "id": la.attempt.job_id,
            "suite": la.suite,
            "config": la.config_name,
            "overrides": la.overrides,  # the job's setting (`--set`, `--grid`)
            "seed": la.seed,
            "data": la.data,
            "gpu": la.attempt.gpu_index,
            "attempt": la.attempt.n,
            "level": la.attempt.level,
            "elapsed_s": now_s() - la.attempt.started_at,
            "held_mib": la.attempt.held_mib,
            # its share of its card's SMs (NVML per process); null: not known
            "sm_pct": la.attempt.sm_pct,
            "predicted_mib": la.attempt.predicted_peak_mib,
            # started on trial under --mps: the room it got, its fence (less than its prediction)
            "trial_fence_mib": la.attempt.trial_fence_mib,
            "progress": la.attempt.progress or None,
            "executor": la.attempt.executor,
            "executor_id": la.attempt.executor_id,
            "executor_state": la.attempt.executor_state,  # Slurm: e.g. "PENDING (Resources)"
            # the warm process that trains it, as its share.json says: `fused ab12-0 · jobs 3,4,5`
            # (the running jobs of that process) or `warm ab12-0`; null: a process of its own
            "shares": shares.get(la.attempt.id),
        }
        for la in live
    ]
    jobs = list(iter_status_jobs(store)) if all_jobs else []
    heartbeat_at = reading.heartbeat_at if reading else None
    return {
        "db": str(store.path),
        "daemon": {
            "alive": daemon is not None,
            "pid": daemon["pid"] if daemon else None,
            "draining": bool(daemon["draining"]) if daemon else False,
            "modes": daemon["modes"] if daemon else [],  # opt-in ways it runs: overlap, mps
            "last_tick_age_s": (now_s() - heartbeat_at) if heartbeat_at else None,
        },
        "gpus": gpus,
        "host": host_summary(read_host_reading(store)),
        # the runs dir's free space as the daemon last read it: {path, free_mib, min_free_mib,
        # warn_free_mib, level: ok|low|full}; null before a daemon has run
        "disk": reading.disk if reading else None,
        "counts": state_counts(store),
        "running": running,
        "waiting": [{"id": w.job_id, "suite": w.suite, "config": w.config, "overrides": w.overrides,
                     "seed": w.seed, "data": w.data, "reason": w.reason}
                    for w in first_waiting(store, FIRST_WAITING)],
        # the head of the queue outside paused suites and configs, by its waiting reason, largest first
        "waiting_groups": [asdict(g) for g in waiting_groups(store, WAITING_GROUPS)],
        "paused_suites": [asdict(p) for p in paused_suites(store)],
        "paused_configs": [asdict(p) for p in paused_configs(store)],
        "retries": [{"ts": e.ts, "job": e.job_id, **e.retry} for e in recent_retries(store, RECENT_RETRIES)],
        "events": [{"ts": e.ts, "job": e.job_id, "kind": e.kind, "message": e.message}
                   for e in recent_events(store, RECENT_EVENTS)],
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
