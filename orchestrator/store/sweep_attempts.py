"""Every attempt of a sweep at once, for reports and benchmarks: how many were claimed,
launched and are still live, and the rows themselves. Which columns say that an attempt was
launched is decided here, once."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.store.db import Store
from orchestrator.store.rows import Attempt

# Written right after the executor's call returns: its own id for the attempt (a tmux window,
# a Slurm job) or the process it started. An attempt without either is claimed, not launched.
_LAUNCHED = "executor_id IS NOT NULL OR pid IS NOT NULL"


@dataclass(frozen=True)
class AttemptCounts:
    claimed: int  # every attempt: a slot was claimed for it
    launched: int  # its executor has taken it
    live: int  # no outcome yet


def attempt_counts(store: Store) -> AttemptCounts:
    row = store.query(
        f"SELECT count(*) AS claimed, count(CASE WHEN {_LAUNCHED} THEN 1 END) AS launched, "
        "count(CASE WHEN outcome IS NULL THEN 1 END) AS live FROM attempts"
    )[0]
    return AttemptCounts(int(row["claimed"]), int(row["launched"]), int(row["live"]))


def all_attempts(store: Store) -> list[Attempt]:
    """Every attempt, by id (in the order they were claimed)."""
    return [Attempt.from_row(r) for r in store.query("SELECT * FROM attempts ORDER BY id")]
