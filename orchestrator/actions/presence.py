"""Whether a daemon runs for a state.db: the recorded daemon process, checked to be that very
process (its pid and create time), so a reused pid never passes for a live daemon."""

from __future__ import annotations

from typing import Any

from orchestrator.attempts.reconcile import process_matches
from orchestrator.store.daemon_row import daemon_row_fields
from orchestrator.store.db import Store


def daemon_alive(store: Store) -> dict[str, Any] | None:
    """The running daemon's row, or None (the pid must be alive and be the recorded process)."""
    row = daemon_row_fields(store)
    if row is None or not row["pid"]:
        return None
    return row if process_matches(row["pid"], row["proc_create_time"]) else None
