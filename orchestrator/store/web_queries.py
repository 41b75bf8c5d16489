"""Read-only queries behind `orch web` and `orch report`, returning typed rows. Nothing here
writes. Every list a page shows is bounded, so a database of 10,000 jobs answers quickly."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.lifecycle import AttemptOutcome, JobState
from orchestrator.store.db import Store
from orchestrator.store.json_columns import json_column
from orchestrator.store.queries import SHOWN_ATTEMPT_SQL, state_counts
from orchestrator.store.sharing import share_labels
from orchestrator.store.status import (
    Event,
    GpuNow,
    PausedConfig,
    PausedSuite,
    WaitingJob,
    cards_now,
    daemon_reading,
    first_waiting,
    live_attempts,
    paused_configs,
    paused_suites,
    recent_retries,
)
from orchestrator.wording import number

OOM_OUTCOMES = (AttemptOutcome.OOM.value, AttemptOutcome.HOST_OOM.value)


@dataclass(frozen=True)
class RunningJob:
    job_id: int
    suite: str
    config: str
    seed: int
    data: str
    gpu: int
    attempt: int
    level: int
    started_at: float
    held_mib: int
    predicted_mib: int
    step: int | None
    total: int | None
    loss: float | None
    overrides: dict[str, Any] = field(default_factory=dict)  # the job's `--set` and `--grid` values
    sm_pct: int | None = None  # its share of its card's SMs (NVML per process); None: not known
    shares: str = ""  # the warm process that trains it (`fused ab12-0 · jobs 3,4,5`); "": its own


@dataclass(frozen=True)
class Overview:
    counts: dict[str, int]
    heartbeat_at: float | None
    gpus: list[GpuNow]
    running: list[RunningJob]
    waiting: list[WaitingJob]
    waiting_total: int
    retries: list[Event]
    paused: list[PausedSuite]
    paused_configs: list[PausedConfig]  # by the crash-loop guard, in suites that still run


def _number(value: Any) -> float | None:
    # progress_json comes from a worker's file: keep only finite real numbers
    return number(value) if isinstance(value, (int, float)) else None


def overview(store: Store, *, waiting_limit: int = 50, retries_limit: int = 10) -> Overview:
    daemon = daemon_reading(store)
    live = live_attempts(store)
    shares = share_labels([la.attempt for la in live])
    running = []
    for la in live:
        a = la.attempt
        step, total = _number(a.progress.get("step")), _number(a.progress.get("total"))
        running.append(RunningJob(
            a.job_id, la.suite, la.config_name, la.seed, la.data, a.gpu_index, a.n, a.level, a.started_at,
            a.held_mib, a.predicted_peak_mib, None if step is None else int(step),
            None if total is None else int(total), _number(a.progress.get("loss")), la.overrides, a.sm_pct,
            shares.get(a.id, ""),
        ))
    gpus = cards_now(store, daemon, live)
    counts = state_counts(store)
    return Overview(
        counts=counts,
        heartbeat_at=daemon.heartbeat_at if daemon else None,
        gpus=gpus,
        running=running,
        waiting=first_waiting(store, waiting_limit),
        waiting_total=counts.get(JobState.QUEUED.value, 0),
        retries=recent_retries(store, retries_limit),
        paused=(suites := paused_suites(store)),
        paused_configs=[p for p in paused_configs(store) if p.suite not in {s.suite for s in suites}],
    )


@dataclass(frozen=True)
class AttemptSpan:
    """One attempt as a bar on the timeline."""

    attempt_id: int
    job_id: int
    n: int
    gpu: int
    level: int
    level_step: str | None
    outcome: str | None  # None while it runs
    started_at: float
    ended_at: float | None
    suite: str
    config: str
    seed: int
    data: str
    peak_mib: int
    predicted_mib: int


_SPAN_SQL = (
    "SELECT a.id AS attempt_id, a.job_id, a.n, a.gpu_index AS gpu, a.level, a.level_step, a.outcome, "
    "a.started_at, a.ended_at, j.suite, j.config_name AS config, j.seed, j.data, a.peak_mib, "
    "a.predicted_peak_mib AS predicted_mib FROM attempts a JOIN jobs j ON j.id = a.job_id"
)


def attempt_spans(
    store: Store, *, from_s: float | None = None, to_s: float | None = None, limit: int = 5000
) -> tuple[list[AttemptSpan], int]:
    """Attempts that overlap [from_s, to_s] (the latest `limit` of them, oldest first) and how
    many overlap in all."""
    where: list[str] = []
    params: list[Any] = []
    if to_s is not None:
        where.append("a.started_at <= ?")
        params.append(to_s)
    if from_s is not None:
        where.append("(a.ended_at IS NULL OR a.ended_at >= ?)")
        params.append(from_s)
    clause = (" WHERE " + " AND ".join(where)) if where else ""
    total = store.query("SELECT count(*) AS n FROM attempts a" + clause, params)[0]["n"]
    rows = store.query(_SPAN_SQL + clause + " ORDER BY a.id DESC LIMIT ?", [*params, limit])
    return [AttemptSpan(**r) for r in reversed(rows)], int(total)


@dataclass(frozen=True)
class TimeRange:
    start_s: float | None
    end_s: float | None  # the last end or start seen; a live attempt runs on to now


def sweep_time_range(store: Store) -> TimeRange:
    row = store.query("SELECT min(started_at) AS s, max(coalesce(ended_at, started_at)) AS e FROM attempts")[0]
    return TimeRange(row["s"], row["e"])


@dataclass(frozen=True)
class SweepCounts:
    jobs: int
    attempts: int
    by_state: dict[str, int]
    by_outcome: dict[str, int]
    ooms: int  # attempts that ended in a GPU or host OOM
    oom_jobs_recovered: int  # jobs with an OOM'd attempt that later succeeded


def sweep_counts(store: Store) -> SweepCounts:
    by_state = state_counts(store)
    by_outcome = {
        r["outcome"]: r["n"]
        for r in store.query("SELECT outcome, count(*) AS n FROM attempts WHERE outcome IS NOT NULL GROUP BY outcome")
    }
    attempts = store.query("SELECT count(*) AS n FROM attempts")[0]["n"]
    recovered = store.query(
        "SELECT count(*) AS n FROM jobs j WHERE j.state = ? AND EXISTS (SELECT 1 FROM attempts a "
        "WHERE a.job_id = j.id AND a.outcome IN (?, ?))", [JobState.SUCCEEDED.value, *OOM_OUTCOMES],
    )[0]["n"]
    return SweepCounts(
        jobs=sum(by_state.values()), attempts=int(attempts), by_state=by_state, by_outcome=by_outcome,
        ooms=sum(by_outcome.get(o, 0) for o in OOM_OUTCOMES), oom_jobs_recovered=int(recovered),
    )


@dataclass(frozen=True)
class ChangeMarker:
    """What a page may need to redraw for; cheap (three index lookups), so a live page can
    ask every second."""

    events: int | None  # newest event: a state change, a retry, a cancel, ...
    progress: float | None  # newest heartbeat of a live attempt (step, loss)
    samples: int | None  # newest memory sample


def change_marker(store: Store) -> ChangeMarker:
    row = store.query(
        "SELECT (SELECT max(id) FROM events) AS e, "
        "(SELECT max(last_progress_at) FROM attempts WHERE outcome IS NULL) AS p, "
        "(SELECT max(id) FROM gpu_samples) AS g"
    )[0]
    return ChangeMarker(row["e"], row["p"], row["g"])


@dataclass(frozen=True)
class OomMark:
    """An attempt that ran out of memory, where the memory chart marks it."""

    ts: float
    gpu: int
    job_id: int
    attempt: int
    config: str
    outcome: str


def oom_marks(store: Store, since_s: float | None = None, limit: int = 2000) -> list[OomMark]:
    sql = ("SELECT a.ended_at AS ts, a.gpu_index AS gpu, a.job_id, a.n AS attempt, j.config_name AS config, a.outcome "
           "FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.outcome IN (?, ?) AND a.ended_at IS NOT NULL")
    params: list[Any] = [*OOM_OUTCOMES]
    if since_s is not None:
        sql += " AND a.ended_at >= ?"
        params.append(since_s)
    rows = store.query(sql + " ORDER BY a.ended_at DESC LIMIT ?", [*params, limit])
    return [OomMark(**r) for r in reversed(rows)]


def job_configs(store: Store, job_ids: Iterable[int]) -> dict[int, str]:
    """Job id -> its config's name, for the ids asked (in chunks: SQLite bounds parameters)."""
    ids = sorted(set(job_ids))
    configs: dict[int, str] = {}
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        for r in store.query(f"SELECT id, config_name FROM jobs WHERE id IN ({','.join('?' * len(chunk))})", chunk):
            configs[int(r["id"])] = str(r["config_name"])
    return configs



@dataclass(frozen=True)
class JobsFilter:
    state: str | None = None
    suite: str | None = None
    config: str | None = None
    data: str | None = None


@dataclass(frozen=True)
class JobsPageRow:
    id: int
    state: str
    suite: str
    config: str
    seed: int
    data: str
    level: int
    attempts: int
    gpu: int | None  # of its live attempt
    overrides: dict[str, Any]  # its --set overrides
    reason: str | None  # why it failed, or why it waits
    updated_at: float


@dataclass(frozen=True)
class JobsPage:
    rows: list[JobsPageRow]
    total: int  # jobs matching the filter (rows holds at most `limit` of them)
    suites: list[str]  # the values the filters offer
    configs: list[str]
    datas: list[str]


def _filter_sql(f: JobsFilter) -> tuple[str, list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    for column, value in (("j.state", f.state), ("j.suite", f.suite), ("j.config_name", f.config), ("j.data", f.data)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    return (" WHERE " + " AND ".join(where)) if where else "", params


def _distinct(store: Store, column: str, limit: int) -> list[str]:
    return [str(r["v"]) for r in store.query(f"SELECT DISTINCT {column} AS v FROM jobs ORDER BY v LIMIT ?", [limit])]


def jobs_page(store: Store, f: JobsFilter, *, limit: int = 500, offset: int = 0, facets_limit: int = 500) -> JobsPage:
    """The jobs matching a filter, newest first, bounded, with what each filter can pick."""
    clause, params = _filter_sql(f)
    total = int(store.query("SELECT count(*) AS n FROM jobs j" + clause, params)[0]["n"])
    rows = store.query(
        "SELECT j.id, j.state, j.suite, j.config_name, j.seed, j.data, j.level, j.attempt_count, j.overrides_json, "
        "coalesce(j.reason, j.wait_reason) AS reason, j.updated_at, "
        # the card of its live attempt, or of the last attempt of a job that has ended (as `orch jobs`)
        f"(SELECT a.gpu_index FROM attempts a WHERE a.job_id = j.id AND {SHOWN_ATTEMPT_SQL}) AS gpu "
        "FROM jobs j" + clause + " ORDER BY j.id DESC LIMIT ? OFFSET ?", [*params, limit, offset],
    )
    out = []
    for r in rows:
        out.append(JobsPageRow(
            r["id"], r["state"], r["suite"], r["config_name"], r["seed"], r["data"], r["level"], r["attempt_count"],
            r["gpu"], json_column(r["overrides_json"], {}), r["reason"], r["updated_at"],
        ))  # fmt: skip
    return JobsPage(out, total, _distinct(store, "suite", facets_limit), _distinct(store, "config_name", facets_limit),
                    _distinct(store, "data", facets_limit))
