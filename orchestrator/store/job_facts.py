"""What the job lists show beside a job's state: its run time and the last value of each
metric its latest reporting attempt gave (from metric_history), read in one query per chunk."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.store.db import Store
from orchestrator.store.json_columns import json_column

CHUNK = 500  # ids per query (SQLite's bound on parameters is far above)


@dataclass(frozen=True)
class JobFacts:
    job: int
    run_s: float | None = None  # every attempt's time from start to end (or to now, while it runs)
    attempt: int | None = None  # the attempt the values come from
    last_values: dict[str, float] = field(default_factory=dict)  # key -> its value at its last step
    overrides: dict[str, Any] = field(default_factory=dict)  # its --set and grid values
    submitted_at: float | None = None  # when it was queued (epoch seconds)
    started_at: float | None = None  # when its first attempt started; None before
    ended_at: float | None = None  # when its last attempt ended, once the job has ended


def job_facts(store: Store, job_ids: Sequence[int], now_s: float) -> dict[int, JobFacts]:
    run_s: dict[int, float] = {}
    latest: dict[int, tuple[int, dict[str, float]]] = {}
    overrides: dict[int, dict[str, Any]] = {}
    times: dict[int, list[float | None]] = {}  # submitted, started, ended
    for start in range(0, len(job_ids), CHUNK):
        ids = list(job_ids[start:start + CHUNK])
        marks = ",".join("?" * len(ids))
        for job, seconds in store.iter_rows(
            f"SELECT job_id, sum(max(0, COALESCE(ended_at, ?) - started_at)) FROM attempts "
            f"WHERE job_id IN ({marks}) AND started_at IS NOT NULL GROUP BY job_id", [now_s, *ids]):
            run_s[int(job)] = float(seconds or 0.0)
        for job, text, created in store.iter_rows(
                f"SELECT id, overrides_json, created_at FROM jobs WHERE id IN ({marks})", ids):
            overrides[int(job)] = json_column(text, {})
            times[int(job)] = [created, None, None]
        for job, started, ended in store.iter_rows(
            "SELECT a.job_id, min(a.started_at), CASE WHEN j.state IN ('succeeded', 'failed', 'cancelled') "
            f"THEN max(a.ended_at) END FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.job_id IN ({marks}) "
            "GROUP BY a.job_id", ids):
            times.setdefault(int(job), [None, None, None])[1:] = [started, ended]
        for job, n, key, value in store.iter_rows(
            "SELECT a.job_id, a.n, h.key, h.value FROM metric_history h JOIN attempts a ON a.id = h.attempt_id "
            f"WHERE a.job_id IN ({marks}) AND h.step = (SELECT max(h2.step) FROM metric_history h2 "
            "WHERE h2.attempt_id = h.attempt_id AND h2.key = h.key) ORDER BY a.job_id, a.n", ids):
            held = latest.get(int(job))
            if held is None or held[0] < int(n):
                held = latest[int(job)] = (int(n), {})
            held[1][str(key)] = float(value)
    facts = {}
    for job in job_ids:
        attempt, values = latest.get(job, (None, {}))
        facts[job] = JobFacts(job, run_s.get(job), attempt, values, overrides.get(job, {}),
                              *times.get(job, [None, None, None]))
    return facts


def job_states(store: Store, job_ids: Sequence[int]) -> dict[int, str]:
    """The state of each of these jobs that exists."""
    found: dict[int, str] = {}
    for start in range(0, len(job_ids), CHUNK):
        ids = list(job_ids[start:start + CHUNK])
        for job, state in store.iter_rows(f"SELECT id, state FROM jobs WHERE id IN ({','.join('?' * len(ids))})", ids):
            found[int(job)] = str(state)
    return found
