"""What the scheduler keeps between passes. Its one owner is the daemon; only the scheduling pass
(scheduling.dispatch) reads and updates it. Prediction's own caches sit in `shapes`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.prediction.durations import DurationTable
from orchestrator.prediction.job_facts import JobShapeCache
from orchestrator.scheduling.queue_index import QueueCache
from orchestrator.scheduling.queue_kinds import KindIndex


@dataclass
class SchedulerState:
    shapes: JobShapeCache = field(default_factory=JobShapeCache)  # facts per job and per shape
    durations: DurationTable = field(default_factory=DurationTable)
    durations_seen: dict[int, float] = field(default_factory=dict)  # attempt id -> ended_at
    durations_after_s: float | None = None  # re-read succeeded attempts ended from here on
    queue: QueueCache = field(default_factory=QueueCache)  # the queued jobs, kept up to date from the change log
    kinds: KindIndex = field(default_factory=KindIndex)  # queued jobs by kind, in queue order
    # while nothing can start: what the head's waiting reasons were last worked out from, and when
    waiting_checked: tuple[Any, tuple[Any, ...], float] | None = None
