"""Learned start-ups (launch to the first training step, memory held before it), per suite and
config: rows in, `Startup`s out."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.store.db import Store


@dataclass(frozen=True)
class Startup:
    seconds: float  # launch to the first training step: the shortest seen
    held_mib: int  # GPU memory held until shortly before the first step: the most seen
    samples: int


def record_startup(store: Store, key: str, seconds: float, held_mib: int) -> None:
    """Fold one attempt's start-up into its key. The shortest start-up is kept: one taken too
    long starts the next job's training while the old one still runs, an OOM (measured on an
    H100: a first start-up of 17.5 s, later ones 9-12 s, and the early start on the mean OOM'd);
    one taken too short only overlaps less. The most memory held is kept: a hold taken too small
    starts a job beside memory it will need (each is read until shortly before the first step,
    without that step's allocations: orchestrator.prediction.startup)."""
    with store.write():
        store.execute(
            "INSERT INTO startups (key, seconds, held_mib, samples, updated_at) VALUES (?, ?, ?, 1, ?) "
            "ON CONFLICT(key) DO UPDATE SET seconds = min(seconds, excluded.seconds), "
            "held_mib = max(held_mib, excluded.held_mib), samples = samples + 1, updated_at = excluded.updated_at",
            [key, seconds, held_mib, store.now_s()],
        )


def read_startups(store: Store) -> dict[str, Startup]:
    rows = store.query("SELECT key, seconds, held_mib, samples FROM startups")
    return {str(r["key"]): Startup(float(r["seconds"]), int(r["held_mib"]), int(r["samples"])) for r in rows}
