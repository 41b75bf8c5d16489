"""What tests read back of a state.db, through the store's own readers rather than SQL of
their own: the schema then lives in orchestrator/store alone."""

from __future__ import annotations

from orchestrator.lifecycle import JobState
from orchestrator.store.db import Store
from orchestrator.store.queries import get_job, job_ids_in_states, state_counts


def job_ids(store: Store, *states: JobState, suite: str | None = None) -> list[int]:
    """Ids of the jobs in one of `states` (every job when none is given), by id."""
    return job_ids_in_states(store, states or tuple(JobState), suite)


def job_count(store: Store) -> int:
    return sum(state_counts(store).values())


def state_of(store: Store, job_id: int) -> str:
    return get_job(store, job_id).state.value
