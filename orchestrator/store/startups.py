"""Learned start-ups (launch to the first training step, memory held before it), per suite and
config: rows in, `Startup`s out."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.store.db import Store


@dataclass(frozen=True)
class Startup:
    seconds: float  # launch to the first training step, mean over the attempts seen
    held_mib: int  # the most GPU memory an attempt held before its first step
    samples: int


def record_startup(store: Store, key: str, seconds: float, held_mib: int) -> None:
    """Fold one attempt's start-up into the running mean of its key."""
    with store.write():
        store.execute(
            "INSERT INTO startups (key, seconds, held_mib, samples, updated_at) VALUES (?, ?, ?, 1, ?) "
            "ON CONFLICT(key) DO UPDATE SET seconds = (seconds * samples + excluded.seconds) / (samples + 1), "
            "held_mib = max(held_mib, excluded.held_mib), samples = samples + 1, updated_at = excluded.updated_at",
            [key, seconds, held_mib, store.now_s()],
        )


def read_startups(store: Store) -> dict[str, Startup]:
    rows = store.query("SELECT key, seconds, held_mib, samples FROM startups")
    return {str(r["key"]): Startup(float(r["seconds"]), int(r["held_mib"]), int(r["samples"])) for r in rows}
