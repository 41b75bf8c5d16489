"""orch from Python: `Sweep` (a notebook's view of a state database) and the implementations the
CLI shares with it (submit, curves, the job lists' headline metric)."""

from orchestrator.api.sweep import Sweep

__all__ = ["Sweep"]
