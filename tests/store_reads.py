"""What tests read back of a state.db, through the store's own readers rather than SQL of
their own: the schema then lives in orchestrator/store alone."""

from __future__ import annotations

from orchestrator.lifecycle import JobState
from orchestrator.store.db import Store
from orchestrator.store.queries import get_job, job_ids_in_states, state_counts
from orchestrator.store.queue import jobs_by_id
from orchestrator.store.rows import Attempt, Job
from orchestrator.store.status import Event, recent_events
from orchestrator.store.sweep_attempts import all_attempts

EVERY_EVENT = 10**9  # a limit no test database reaches


def job_ids(store: Store, *states: JobState, suite: str | None = None) -> list[int]:
    """Ids of the jobs in one of `states` (every job when none is given), by id."""
    return job_ids_in_states(store, states or tuple(JobState), suite)


def read_jobs(store: Store, *states: JobState, suite: str | None = None) -> list[Job]:
    """The jobs in one of `states` (every job when none is given), whole, by id."""
    by_id = jobs_by_id(store, job_ids(store, *states, suite=suite))
    return [by_id[job_id] for job_id in sorted(by_id)]


def job_count(store: Store) -> int:
    return sum(state_counts(store).values())


def state_of(store: Store, job_id: int) -> str:
    return get_job(store, job_id).state.value


def live_attempts(store: Store) -> list[Attempt]:
    """Every attempt without an outcome yet, by id."""
    return [a for a in all_attempts(store) if a.outcome is None]


def events(store: Store, kind: str | None = None, *, job_id: int | None = None) -> list[Event]:
    """Every event (of one kind, of one job, when given), oldest first."""
    return [e for e in recent_events(store, EVERY_EVENT)
            if (kind is None or e.kind == kind) and (job_id is None or e.job_id == job_id)]
