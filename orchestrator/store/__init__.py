"""state.db: the only place orch keeps state."""

from orchestrator.store.db import Store, default_db_path

__all__ = ["Store", "default_db_path"]
