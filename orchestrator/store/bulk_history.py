"""A sweep's whole history written in one transaction: jobs, their attempts, events, memory
samples and the daemon's last reading, as typed records. For benchmarks and demos that need a
state.db of tens of thousands of rows in seconds; the daemon never writes through here (its
writes go through the transition table one change at a time)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.lifecycle import AttemptOutcome, JobState
from orchestrator.store.db import Store
from orchestrator.store.gpu_samples import INSERT_SAMPLE, GpuSample, sample_row
from orchestrator.store.jobs import INSERT_EVENT, event_row


@dataclass(frozen=True)
class PastJob:
    id: int
    identity: str
    suite: str
    config_name: str
    config_path: str
    seed: int
    data: str
    worker: str
    declared_mib: int
    state: JobState
    queued_at: float  # also its creation and last update
    max_attempts: int
    hang_timeout_s: float
    wait_reason: str | None = None


@dataclass(frozen=True)
class PastAttempt:
    id: int
    job_id: int
    n: int
    gpu_index: int
    gpu_uuid: str
    level: int
    run_dir: str
    predicted_peak_mib: int
    held_mib: int
    peak_mib: int
    started_at: float
    ended_at: float | None = None  # None: still running
    outcome: AttemptOutcome | None = None
    reason: str | None = None
    progress: dict[str, Any] | None = None  # a running attempt's last progress line
    level_step: str = "as_configured"
    prediction_source: str = "measured"
    reserved_mib: int = 0


@dataclass(frozen=True)
class PastEvent:
    ts: float
    job_id: int | None
    attempt_id: int | None
    kind: str
    from_state: str | None
    to_state: str | None
    message: str
    data: dict[str, Any] | None = None  # {"retry": {...}} marks a move down the ladder


def write_history(
    store: Store,
    jobs: Sequence[PastJob],
    attempts: Sequence[PastAttempt],
    events: Sequence[PastEvent],
    samples: Sequence[GpuSample],
    *,
    gpus: list[dict[str, Any]],
    heartbeat_at: float,
) -> None:
    """Write it all into a state.db that has none of these ids yet (StoreError otherwise, and
    nothing written). `gpus`: the daemon's last reading of the cards, as `orch status` shows it;
    the daemon row is written as one that has stopped."""
    attempts_of: dict[int, int] = {}
    for a in attempts:
        attempts_of[a.job_id] = attempts_of.get(a.job_id, 0) + 1
    with store.write():
        store.executemany(
            "INSERT INTO jobs (id, identity, suite, config_name, config_path, config_json, seed, data, overrides_json, "
            "env_json, worker, declared_mib, state, attempt_count, max_attempts, hang_timeout_s, wait_reason, "
            "queued_at, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, '{}', ?, ?, '{}', '{}', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(j.id, j.identity, j.suite, j.config_name, j.config_path, j.seed, j.data, j.worker, j.declared_mib,
              j.state.value, attempts_of.get(j.id, 0), j.max_attempts, j.hang_timeout_s, j.wait_reason,
              j.queued_at, j.queued_at, j.queued_at) for j in jobs],
        )  # fmt: skip
        store.executemany(
            "INSERT INTO attempts (id, job_id, n, gpu_index, gpu_uuid, level, level_step, run_dir, predicted_peak_mib, "
            "prediction_source, reserved_mib, held_mib, peak_mib, reached_peak, started_at, "
            "ended_at, outcome, exit_code, reason, progress_json, last_progress_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?)",
            [(a.id, a.job_id, a.n, a.gpu_index, a.gpu_uuid, a.level, a.level_step, a.run_dir, a.predicted_peak_mib,
              a.prediction_source, a.reserved_mib, a.held_mib, a.peak_mib, a.started_at, a.ended_at,
              None if a.outcome is None else a.outcome.value, None if a.ended_at is None else 0, a.reason,
              None if a.progress is None else json.dumps(a.progress),
              a.started_at if a.progress is not None else None) for a in attempts],
        )  # fmt: skip
        store.executemany(INSERT_EVENT, [
            event_row(e.ts, e.kind, e.message, e.job_id, e.attempt_id, e.from_state, e.to_state, e.data) for e in events
        ])
        store.executemany(INSERT_SAMPLE, [
            sample_row(s.ts, s.gpu_index, s.gpu_uuid, s.total_mib, s.used_mib, s.orch_mib, s.free_mib, s.held_by_job)
            for s in samples
        ])
        store.execute(
            "INSERT INTO daemon (id, pid, heartbeat_at, gpus_json) VALUES (1, NULL, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, gpus_json = excluded.gpus_json",
            [heartbeat_at, json.dumps(gpus)],
        )
