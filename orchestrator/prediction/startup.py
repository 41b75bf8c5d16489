"""Start-up and remaining time of attempts, for start-up overlap. Pure.

A job's start-up is the time from its launch to its first training step (imports, model load,
tokenising), learned per suite and config from the attempts that reached a first step (the
shortest seen: orchestrator.store.startups says why), with the GPU memory it held just before. A
running attempt's remaining time comes from its progress: the steps still to go at the pace of the
steps it has run since its start-up.
"""

from __future__ import annotations

from orchestrator.store.startups import Startup

__all__ = ["Startup", "first_step_seen", "remaining_s", "startup_key"]


def startup_key(suite: str, config_name: str) -> str:
    """What a start-up is learned under: the same script and config load the same things."""
    return f"{suite}/{config_name}"


def first_step_seen(step_before: object, step_now: object) -> bool:
    """Whether a pass saw an attempt's first training step (step 0 is still its start-up)."""
    before = step_before if isinstance(step_before, int) and not isinstance(step_before, bool) else 0
    return isinstance(step_now, int) and not isinstance(step_now, bool) and step_now >= 1 > before


def remaining_s(
    now_s: float, started_at_s: float, startup_s: float | None, step: object, total: object
) -> float | None:
    """Seconds an attempt has left by its progress: (total - step) steps at the pace of the steps
    it ran since its start-up; None without a step and a total, or before a learned start-up ended."""
    if not (isinstance(step, int) and isinstance(total, int)) or isinstance(step, bool) or step < 1 or total < step:
        return None
    training_s = now_s - started_at_s - (startup_s or 0.0)
    if training_s <= 0:
        return None
    return (total - step) * training_s / step
