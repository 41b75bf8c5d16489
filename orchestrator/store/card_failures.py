"""Attempts that failed on a card since a moment: what the daemon's MPS watch reads to tell a
broken MPS server (or a fault that spread between its clients) from a job's own error."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.store.db import Store


@dataclass(frozen=True)
class CardFailure:
    attempt_id: int
    job_id: int
    gpu_uuid: str
    ended_at: float
    reason: str


def failures_since(store: Store, since_s: float) -> list[CardFailure]:
    """Failed attempts that ended at or after `since_s`, oldest first."""
    rows = store.query(
        "SELECT id, job_id, gpu_uuid, ended_at, reason FROM attempts WHERE outcome = 'failed' AND ended_at >= ? "
        "ORDER BY ended_at",
        [since_s],
    )
    return [
        CardFailure(
            int(r["id"]),
            int(r["job_id"]),
            str(r["gpu_uuid"]),
            float(r["ended_at"]),
            str(r["reason"] or ""),
        )
        for r in rows
    ]
