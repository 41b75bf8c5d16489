"""What a cluster's time limit means for one job: read from its row and its earlier attempts."""

from __future__ import annotations

from orchestrator.executors.remote_verdict import TIME_LIMIT_WORDS, TimeLimit
from orchestrator.plans.keymap import KeyMap
from orchestrator.plans.resume import worker_can_resume
from orchestrator.plans.slurm_settings import settings_from_json
from orchestrator.store.cluster_ends import ended_in_state
from orchestrator.store.db import Store
from orchestrator.store.rows import Attempt, Job


def time_limit_of(store: Store, attempt: Attempt, job: Job) -> TimeLimit:
    """Its worker resumes (up to the suite's max_timeouts time limits), or the job fails."""
    settings = settings_from_json(job.slurm or {})
    names = job.worker_output.get("keys") or {}
    keys = KeyMap({str(k): str(v) for k, v in names.items()} if isinstance(names, dict) else {})
    return TimeLimit(
        can_resume=worker_can_resume(job.worker, keys, {**job.config, **attempt.overrides}),
        timeouts_before=ended_in_state(store, job.id, "TIMEOUT", attempt.n, TIME_LIMIT_WORDS),
        max_timeouts=settings.max_timeouts, limit=settings.time,
    )
