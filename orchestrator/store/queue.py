"""Typed reads of jobs and attempts. Those behind one scheduling pass are shaped so that a long
queue costs little per pass: the queue's light columns, whole jobs only for jobs the scheduler
has not seen, and run times of attempts that succeeded since the last read."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestrator.store.db import Store, store_error
from orchestrator.store.row_memo import RowMemo
from orchestrator.store.rows import Attempt, Job, QueueEntry

T = TypeVar("T")
_IN_CHUNK = 500  # host parameters per IN (...) list, well below SQLite's limit


def queued_jobs(store: Store, limit: int | None = None) -> list[QueueEntry]:
    """Queued jobs in queue order (priority, then submission), light columns only."""
    sql = f"SELECT {QueueEntry.COLUMNS} FROM jobs WHERE state = 'queued' ORDER BY priority DESC, id"
    if limit is not None:
        return [QueueEntry.from_row(r) for r in store.query(sql + " LIMIT ?", [int(limit)])]
    return [QueueEntry.from_row(r) for r in store.query(sql)]


def queued_entries(store: Store) -> tuple[int, list[QueueEntry]]:
    """The queue-change mark (see `queue_changes_since`), then every queued job in queue order.
    The mark is read first: a change made between the two reads is read again later."""
    mark = queue_change_mark(store)
    sql = f"SELECT {QueueEntry.COLUMNS} FROM jobs WHERE state = 'queued' ORDER BY priority DESC, id"
    return mark, [QueueEntry.from_values(values) for values in store.iter_rows(sql)]


def queued_with_bad_priority(store: Store) -> list[tuple[int, Any]]:
    """(id, stored priority) of queued jobs whose priority is text or bytes, not a number: written
    before submit checked it, or by hand. A pass fails each. SQLite orders text and blobs after
    every number, so the queue's own index (state, priority) answers this with one seek."""
    sql = "SELECT id, priority FROM jobs WHERE state = 'queued' AND priority >= ''"
    return [(int(job_id), priority) for job_id, priority in store.iter_rows(sql)]


def queue_change_mark(store: Store) -> int:
    """The number of the last queue change logged (m014's trigger), 0 before any."""
    rows = store.query("SELECT seq FROM sqlite_sequence WHERE name = 'queue_changes'")
    return int(rows[0]["seq"]) if rows else 0


def queue_changes_since(store: Store, mark: int) -> tuple[int, set[int]]:
    """(the new mark, ids of jobs that entered, left or changed in the queue after `mark`)."""
    rows = list(store.iter_rows("SELECT seq, job_id FROM queue_changes WHERE seq > ?", [mark]))
    return (max(seq for seq, _ in rows) if rows else mark), {int(job_id) for _, job_id in rows}


def queued_entries_by_id(store: Store, job_ids: Iterable[int]) -> dict[int, QueueEntry]:
    """Those of these jobs that are queued now."""
    ids = list(job_ids)
    found: dict[int, QueueEntry] = {}
    for start in range(0, len(ids), _IN_CHUNK):
        chunk = ids[start : start + _IN_CHUNK]
        sql = f"SELECT {QueueEntry.COLUMNS} FROM jobs WHERE state = 'queued' AND id IN ({','.join('?' * len(chunk))})"
        for values in store.iter_rows(sql, chunk):
            entry = QueueEntry.from_values(values)
            found[entry.id] = entry
    return found


def forget_queue_changes(store: Store, mark: int) -> None:
    """Drop the log up to `mark`, once read (AUTOINCREMENT: numbers are never reused)."""
    with store.write():
        store.execute("DELETE FROM queue_changes WHERE seq <= ?", [mark])


# What a queued job's packing facts are made of (orchestrator.scheduling.dispatch._learn_new_jobs) besides
# its config: jobs equal in these and in their config without `seed` and `data` share them.
_FACT_COLUMNS = (
    "level, host_steps_json, config_path, data, ladder_json, worker, declared_mib, worker_output_json, "
    "memory_keys_json, gpus, cpus, allowed_gpus_json, min_stack_gain, one_token"
)


def queued_jobs_alike(store: Store, job_ids: Iterable[int]) -> list[list[int]]:
    """These jobs, those still queued, in groups that differ only by seed: the config compared
    without `seed` and `data` (by SQLite, not parsed here), and every other column the
    scheduler's per-job facts are made of. A sweep's seeds are then learned once."""
    ids = list(job_ids)
    groups: dict[tuple[object, ...], list[int]] = {}
    seedless = (
        "CASE WHEN json_valid(config_json) THEN json_remove(config_json, '$.seed', '$.data') ELSE config_json END"
    )
    for start in range(0, len(ids), _IN_CHUNK):
        chunk = ids[start : start + _IN_CHUNK]
        sql = (f"SELECT id, {seedless}, {_FACT_COLUMNS} FROM jobs "
               f"WHERE state = 'queued' AND id IN ({','.join('?' * len(chunk))})")
        for row in store.iter_rows(sql, chunk):
            groups.setdefault(tuple(row[1:]), []).append(int(row[0]))
    return list(groups.values())


def queued_whole_jobs(store: Store) -> list[Job]:
    """Every queued job, whole, in queue order (a cluster-placed pass reads them all)."""
    return [
        Job.from_row(r)
        for r in store.query("SELECT * FROM jobs WHERE state = 'queued' ORDER BY priority DESC, id")
    ]


def jobs_by_id(store: Store, job_ids: Iterable[int]) -> dict[int, Job]:
    """Whole job rows for these ids."""
    ids = list(job_ids)
    rows: dict[int, Job] = {}
    for start in range(0, len(ids), _IN_CHUNK):
        chunk = ids[start : start + _IN_CHUNK]
        marks = ",".join("?" * len(chunk))
        for row in store.query(f"SELECT * FROM jobs WHERE id IN ({marks})", chunk):
            rows[int(row["id"])] = Job.from_row(row)
    return rows


@dataclass(frozen=True)
class SucceededRun:
    """A succeeded attempt's run time, with what the run-time table keys it by."""

    attempt_id: int
    config_name: str
    data: str
    level: int
    ended_at: float
    duration_s: float


def succeeded_runs_since(store: Store, ended_at_s: float | None) -> list[SucceededRun]:
    """Succeeded attempts that ended at or after `ended_at_s` (all when None), with their
    config, data and level: the run-time table is built from these. A fused member's (share.json's
    mode `fused`) is left out: its run time is its group's, not its config's alone."""
    sql = (
        "SELECT a.id, j.config_name, j.data, a.level, a.ended_at, a.ended_at - a.started_at AS duration_s"
        " FROM attempts a JOIN jobs j ON j.id = a.job_id"
        " WHERE a.outcome = 'succeeded' AND a.ended_at IS NOT NULL AND a.share_mode IS NOT 'fused'"
    )
    rows = store.query(sql) if ended_at_s is None else store.query(sql + " AND a.ended_at >= ?", [ended_at_s])
    return [
        SucceededRun(
            int(r["id"]),
            r["config_name"],
            r["data"],
            int(r["level"]),
            float(r["ended_at"]),
            float(r["duration_s"]),
        )
        for r in rows
    ]


_LIVE_ATTEMPTS: RowMemo[Attempt] = RowMemo(Attempt.from_row)
_LIVE_JOBS: RowMemo[Job] = RowMemo(Job.from_row)


def _kept_rows(store: Store, memo: RowMemo[T], sql: str, params: Sequence[Any] = ()) -> list[T]:
    try:
        return memo.rows(store.execute(sql, params))
    except sqlite3.DatabaseError as exc:  # raised while the rows are fetched, past `execute`
        raise store_error(store.path, exc) from None


def live_attempts_with_jobs(store: Store) -> tuple[list[Attempt], dict[int, Job]]:
    """Every live attempt (in id order), and the jobs they belong to by id. Rows unchanged since
    the last call are not built again (`RowMemo`)."""
    live = _kept_rows(store, _LIVE_ATTEMPTS, "SELECT * FROM attempts WHERE outcome IS NULL ORDER BY id")
    ids = sorted({a.job_id for a in live})
    jobs: dict[int, Job] = {}
    for start in range(0, len(ids), _IN_CHUNK):
        chunk = ids[start : start + _IN_CHUNK]
        marks = ",".join("?" * len(chunk))
        jobs.update(
            (j.id, j)
            for j in _kept_rows(
                store, _LIVE_JOBS, f"SELECT * FROM jobs WHERE id IN ({marks})", chunk
            )
        )
    _LIVE_ATTEMPTS.keep_only(a.id for a in live)
    _LIVE_JOBS.keep_only(jobs)
    return live, jobs


def live_attempt_count(store: Store) -> int:
    return int(store.query("SELECT count(*) AS n FROM attempts WHERE outcome IS NULL")[0]["n"])


def write_wait_reasons(store: Store, changed: Sequence[tuple[str | None, int]]) -> None:
    """(reason, job id) pairs: each still queued job's waiting reason, in one transaction."""
    if not changed:
        return
    with store.write():
        store.executemany("UPDATE jobs SET wait_reason = ? WHERE id = ? AND state = 'queued'", changed)


def job_by_id(store: Store, job_id: int) -> Job | None:
    rows = store.query("SELECT * FROM jobs WHERE id = ?", [job_id])
    return Job.from_row(rows[0]) if rows else None
