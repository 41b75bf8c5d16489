"""The metric_history table: every metric an attempt reported, at its step, kept bounded.

Writes upsert one value per (attempt, key, step), so the same file read twice (a restarted
daemon) changes nothing. A key whose history grows past MAX_POINTS_PER_KEY is downsampled to
half of it (attempts.history_points.downsample: first, last, and each bucket's min and max).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from orchestrator.store.db import Store
from orchestrator.store.history_bounds import (
    MAX_KEYS,
    MAX_POINTS_PER_KEY,
    Point,
    downsample,
    keep_keys,
)

_UPSERT = "INSERT OR REPLACE INTO metric_history (attempt_id, key, step, value) VALUES (?, ?, ?, ?)"


class HistoryPoint(NamedTuple):
    """One tidy row of a curve: which job and attempt, at which step, which key, what value. A
    typed tuple, not a dataclass: an export builds hundreds of thousands, four times faster."""

    job: int
    attempt: int  # the attempt's n within its job
    step: float
    key: str
    value: float


def history_keys(store: Store, attempt_id: int) -> set[str]:
    rows = store.query("SELECT DISTINCT key FROM metric_history WHERE attempt_id = ?", [attempt_id])
    return {str(r["key"]) for r in rows}


def record_history(store: Store, attempt_id: int, points: Iterable[Point], known_keys: set[str] | None = None,
                   cap: int = MAX_POINTS_PER_KEY) -> int:
    """Add points to an attempt's history (at most MAX_KEYS keys; `known_keys`, the attempt's
    keys so far, is read when not given and updated); returns how many were written."""
    known = history_keys(store, attempt_id) if known_keys is None else known_keys
    kept = keep_keys(points, known, MAX_KEYS)
    if not kept:
        return 0
    with store.write():
        store.executemany(_UPSERT, [(attempt_id, p.key, p.step, p.value) for p in kept])
        for key in {p.key for p in kept}:
            _bound(store, attempt_id, key, cap)
    return len(kept)


def _bound(store: Store, attempt_id: int, key: str, cap: int) -> None:
    (count,) = store.execute("SELECT count(*) FROM metric_history WHERE attempt_id = ? AND key = ?",
                             [attempt_id, key]).fetchone()
    if count <= cap:
        return
    rows = store.execute("SELECT step, value FROM metric_history WHERE attempt_id = ? AND key = ? ORDER BY step",
                         [attempt_id, key]).fetchall()
    kept = downsample([(float(s), float(v)) for s, v in rows], cap // 2)
    store.execute("DELETE FROM metric_history WHERE attempt_id = ? AND key = ?", [attempt_id, key])
    store.executemany(_UPSERT, [(attempt_id, key, s, v) for s, v in kept])


def history_values(store: Store, attempt_id: int, key: str) -> list[float]:
    """One key's values in an attempt's history, in step order (as kept: bounded)."""
    rows = store.execute("SELECT value FROM metric_history WHERE attempt_id = ? AND key = ? ORDER BY step",
                         [attempt_id, key]).fetchall()
    return [float(value) for (value,) in rows]


def last_history_step(store: Store, attempt_id: int) -> float | None:
    (step,) = store.execute("SELECT max(step) FROM metric_history WHERE attempt_id = ?", [attempt_id]).fetchone()
    return None if step is None else float(step)


def _selection(jobs: Sequence[int] | None, suite: str | None) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if jobs is not None:
        where.append(f"a.job_id IN ({','.join('?' * len(jobs))})")
        params += list(jobs)
    if suite is not None:
        where.append("j.suite = ?")
        params.append(suite)
    return where, params


def selection_keys(store: Store, *, jobs: Sequence[int] | None = None, suite: str | None = None) -> list[str]:
    """The metric keys the chosen jobs' history holds, sorted."""
    where, params = _selection(jobs, suite)
    rows = store.query("SELECT DISTINCT h.key FROM metric_history h JOIN attempts a ON a.id = h.attempt_id "
                       "JOIN jobs j ON j.id = a.job_id" + (" WHERE " + " AND ".join(where) if where else "")
                       + " ORDER BY h.key", params)
    return [str(row["key"]) for row in rows]


def iter_history(store: Store, *, jobs: Sequence[int] | None = None, suite: str | None = None,
                 keys: Sequence[str] | None = None) -> Iterator[HistoryPoint]:
    """Tidy points of the chosen jobs (all when neither `jobs` nor `suite` is given), ordered by
    job, attempt, key and step; rows stream from a cursor, so memory stays flat."""
    where, params = _selection(jobs, suite)
    if keys is not None:
        where.append(f"h.key IN ({','.join('?' * len(keys))})")
        params += list(keys)
    sql = ("SELECT a.job_id, a.n, h.step, h.key, h.value FROM metric_history h "
           "JOIN attempts a ON a.id = h.attempt_id JOIN jobs j ON j.id = a.job_id"
           + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY a.job_id, a.n, h.key, h.step")
    # the columns are HistoryPoint's fields in order (SQLite gives REAL steps and values as floats)
    yield from map(HistoryPoint._make, store.iter_rows(sql, params, batch=5000))
