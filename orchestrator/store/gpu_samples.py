"""The gpu_samples table: each GPU's memory over time, written by the daemon, bounded in size.

Bounded by thinning, not by dropping history: when a GPU has more than `max_rows_per_gpu`
rows, every other row of its older half is deleted. Recent memory keeps full resolution and
the whole sweep stays visible at a coarser one, in at most `max_rows_per_gpu` rows per GPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.store.db import Store

SAMPLE_EVERY_S = 2.0
MAX_ROWS_PER_GPU = 2000


@dataclass(frozen=True)
class GpuReading:
    """What the daemon read from one GPU in one tick."""

    index: int
    uuid: str
    total_mib: int
    used_mib: int
    free_mib: int


@dataclass(frozen=True)
class GpuSample:
    ts: float
    gpu_index: int
    gpu_uuid: str
    total_mib: int
    used_mib: int
    orch_mib: int  # held by the process trees of orch's live attempts
    free_mib: int
    held_by_job: dict[int, int] = field(default_factory=dict)  # job id -> MiB its attempt held (empty if unknown)

    @property
    def foreign_mib(self) -> int:
        return max(0, self.used_mib - self.orch_mib)


def _holds(text: str | None) -> dict[int, int]:
    try:
        raw = json.loads(text) if text else {}
    except ValueError:
        return {}
    if not isinstance(raw, dict):
        return {}
    return {int(k): int(v) for k, v in raw.items() if str(k).isdigit() and isinstance(v, int)}


INSERT_SAMPLE = (
    "INSERT INTO gpu_samples (ts, gpu_index, gpu_uuid, total_mib, used_mib, orch_mib, free_mib, holds_json) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def sample_row(ts: float, gpu_index: int, gpu_uuid: str, total_mib: int, used_mib: int, orch_mib: int,
               free_mib: int, held_by_job: Mapping[int, int]) -> tuple[Any, ...]:
    """A gpu_samples row as INSERT_SAMPLE takes it; what each job held, by job id."""
    return (
        ts,
        gpu_index,
        gpu_uuid,
        total_mib,
        used_mib,
        orch_mib,
        free_mib,
        json.dumps(dict(held_by_job), sort_keys=True),
    )


def record_gpu_samples(
    store: Store,
    readings: Iterable[GpuReading],
    ts: float,
    *,
    every_s: float = SAMPLE_EVERY_S,
    max_rows_per_gpu: int = MAX_ROWS_PER_GPU,
) -> bool:
    """Write one sample per GPU unless the last one is younger than `every_s`; thin a GPU's
    rows past `max_rows_per_gpu`. Returns whether anything was written."""
    readings = list(readings)
    if not readings:
        return False
    # checked before taking the write lock: most ticks write nothing (one daemon per state.db)
    newest = store.query("SELECT ts FROM gpu_samples ORDER BY id DESC LIMIT 1")  # by rowid: no scan
    last = newest[0]["ts"] if newest else None
    if last is not None and ts - float(last) < every_s:
        return False
    with store.write():
        held: dict[str, int] = {}
        by_job: dict[str, dict[int, int]] = {}
        for uuid, job_id, mib in store._db.execute(
            "SELECT gpu_uuid, job_id, sum(held_mib) FROM attempts WHERE outcome IS NULL GROUP BY gpu_uuid, job_id"
        ).fetchall():
            held[uuid] = held.get(uuid, 0) + int(mib or 0)
            if mib:
                by_job.setdefault(uuid, {})[int(job_id)] = int(mib)
        store._db.conn.executemany(INSERT_SAMPLE, [
            sample_row(ts, r.index, r.uuid, r.total_mib, r.used_mib, min(held.get(r.uuid, 0), r.used_mib), r.free_mib,
                       by_job.get(r.uuid, {}))
            for r in readings
        ])
        for r in readings:
            _thin(store, r.uuid, max_rows_per_gpu)
    return True


def _thin(store: Store, uuid: str, max_rows: int) -> None:
    count = store._db.execute("SELECT count(*) FROM gpu_samples WHERE gpu_uuid = ?", [uuid]).fetchone()[0]
    if count <= max_rows:
        return
    old_half = [
        row[0]
        for row in store._db.execute(
            "SELECT id FROM gpu_samples WHERE gpu_uuid = ? ORDER BY id LIMIT ?", [uuid, count // 2]
        ).fetchall()
    ]
    store._db.conn.executemany("DELETE FROM gpu_samples WHERE id = ?", [(i,) for i in old_half[1::2]])


def gpu_sample_series(store: Store, since_s: float | None = None) -> list[GpuSample]:
    """Every sample (oldest first), optionally only those at or after `since_s`."""
    sql = "SELECT ts, gpu_index, gpu_uuid, total_mib, used_mib, orch_mib, free_mib, holds_json FROM gpu_samples"
    params: list[float] = []
    if since_s is not None:
        sql += " WHERE ts >= ?"
        params.append(since_s)
    return [
        GpuSample(r["ts"], r["gpu_index"], r["gpu_uuid"], r["total_mib"], r["used_mib"], r["orch_mib"], r["free_mib"],
                  _holds(r["holds_json"]))
        for r in store.query(sql + " ORDER BY id", params)
    ]


def gpu_indexes(store: Store, gpu_uuids: Iterable[str]) -> dict[str, int]:
    """The index each card had at its last sample (cards never sampled are left out)."""
    found: dict[str, int] = {}
    for uuid in set(gpu_uuids):
        rows = store.query("SELECT gpu_index FROM gpu_samples WHERE gpu_uuid = ? ORDER BY id DESC LIMIT 1", [uuid])
        if rows:
            found[uuid] = int(rows[0]["gpu_index"])
    return found
