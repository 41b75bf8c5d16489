"""Which cards attempts failed on for one named reason (an MPS server that broke its clients)."""

from __future__ import annotations

from orchestrator.store.db import Store


def cards_failed_for(store: Store, reason: str, since_s: float) -> set[str]:
    """GPU UUIDs of attempts that ended since `since_s` with exactly this reason."""
    rows = store.query(
        "SELECT DISTINCT gpu_uuid FROM attempts WHERE outcome = 'failed' AND ended_at >= ? AND reason = ?",
        [since_s, reason],
    )
    return {str(r["gpu_uuid"]) for r in rows}
