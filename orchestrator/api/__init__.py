"""orch from Python: `Sweep` (a notebook's view and control of a state database) and the
implementations the CLI shares with it (curves, the job lists' headline metric, the status
snapshot, the daemon's start and stop); submitting is `orchestrator.submit`, a stage below."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.api.sweep import Sweep

__all__ = ["Sweep"]


def __getattr__(name: str) -> Any:
    # `Sweep` pulls in submit, the user actions and the scheduler's reads: a CLI command that only
    # needs `orchestrator.api.jobs` should not pay for them at every start.
    if name == "Sweep":
        from orchestrator.api.sweep import Sweep

        return Sweep
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
