"""What the scheduler keeps between passes. Its one owner is the daemon; only the scheduling pass
(scheduling.dispatch) reads and updates it. Prediction's own caches sit in `shapes`."""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.prediction.durations import DurationTable
from orchestrator.prediction.job_facts import JobFacts, JobShapeCache
from orchestrator.scheduling.queue_index import QueueCache
from orchestrator.scheduling.queue_kinds import KindIndex


@dataclass
class QueuedJobFacts:
    """Each queued job's facts (level, shape, cards, host needs), valid while its level and host
    steps stay. Jobs alike (the seeds of a sweep) share one object, kept in `pool`."""

    by_job: dict[int, JobFacts] = field(default_factory=dict)
    pool: dict[tuple[Any, ...], JobFacts] = field(default_factory=dict)

    def share(self, facts: JobFacts) -> JobFacts:
        """The pooled object equal to `facts` (`facts` itself the first time)."""
        return self.pool.setdefault(facts.pool_key, facts)

    def keep_only(self, queued: Container[int]) -> None:
        self.by_job = {k: v for k, v in self.by_job.items() if k in queued}

    def forget(self, job_ids: Iterable[int]) -> None:
        for job_id in job_ids:
            self.by_job.pop(job_id, None)

    def trim_pool(self) -> None:
        """Drop pooled facts no queued job has."""
        kept = {id(f) for f in self.by_job.values()}
        self.pool = {k: f for k, f in self.pool.items() if id(f) in kept}


@dataclass
class SchedulerState:
    shapes: JobShapeCache = field(default_factory=JobShapeCache)  # prediction's facts per shape and ladder
    job_facts: QueuedJobFacts = field(default_factory=QueuedJobFacts)  # facts per queued job
    durations: DurationTable = field(default_factory=DurationTable)
    durations_seen: dict[int, float] = field(default_factory=dict)  # attempt id -> ended_at
    durations_after_s: float | None = None  # re-read succeeded attempts ended from here on
    queue: QueueCache = field(default_factory=QueueCache)  # the queued jobs, kept up to date from the change log
    kinds: KindIndex = field(default_factory=KindIndex)  # queued jobs by kind, in queue order
    # while nothing can start: what the head's waiting reasons were last worked out from, and when
    # (the monotonic clock's reading)
    waiting_checked: tuple[Any, tuple[Any, ...], float] | None = None
