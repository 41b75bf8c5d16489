"""What a running attempt teaches at its first training step: how long its start-up took and
what it held on the GPU until then (orchestrator.prediction.startup)."""

from __future__ import annotations

import logging

from orchestrator.executors.observation import Observation
from orchestrator.prediction.startup import first_step_seen, startup_key
from orchestrator.store.db import Store
from orchestrator.store.rows import Attempt, Job
from orchestrator.store.startups import record_startup

log = logging.getLogger(__name__)


def learn_startup(store: Store, attempt: Attempt, job: Job, obs: Observation, now_s: float) -> None:
    """Record the start-up of an attempt whose first step this pass saw (its progress before the
    pass had no step). What it held is the last reading before that step."""
    step_now = (obs.last_progress or {}).get("step")
    if not first_step_seen((attempt.progress or {}).get("step"), step_now):
        return
    seen_at = obs.last_progress_at if obs.last_progress_at is not None else now_s
    seconds = max(0.0, float(seen_at) - attempt.started_at)
    try:
        record_startup(store, startup_key(job.suite, job.config_name), seconds, attempt.held_mib)
    except Exception:  # learning must not stop reconciling the others
        log.warning("cannot record the start-up of attempt %s", attempt.id, exc_info=True)
