"""What live and ended attempts teach while the watcher looks at them: a finished attempt's host
RAM and CPU peaks, and samples/s between two progress readings of a running one."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from orchestrator.attempts.outcomes import learn_rate
from orchestrator.attempts.resource_use import ResourceTracker
from orchestrator.prediction.job_facts import attempt_shape_key
from orchestrator.scheduling.state import SchedulerState
from orchestrator.store.db import Store
from orchestrator.store.resources import learn_host_shape
from orchestrator.store.rows import Attempt, Job

log = logging.getLogger(__name__)


class AttemptLessons:
    def __init__(self, store: Store, scheduler: SchedulerState, resources: ResourceTracker) -> None:
        self.store = store
        self.scheduler = scheduler
        self.resources = resources
        self._rates: dict[int, tuple[int, float, int]] = {}  # attempt -> last (step, time, tenants)

    def keep_only(self, attempt_ids: Iterable[int]) -> None:
        keep = set(attempt_ids)
        self._rates = {k: v for k, v in self._rates.items() if k in keep}

    def host(self, attempt: Attempt, job: Job) -> None:
        """A finished attempt's host RAM and CPU peaks teach its shape."""
        self.resources.forget(attempt.id)
        if not attempt.host_peak_mib:
            return
        try:
            learn_host_shape(self.store, attempt_shape_key(job, attempt, self.scheduler.shapes),
                             attempt.host_peak_mib, attempt.cpu_peak_cores)
        except Exception:  # a bad config row must not stop reconciling the others
            log.warning("cannot record the host memory of attempt %s", attempt.id, exc_info=True)

    def rate(self, attempt: Attempt, job: Job, obs: Any, tenants: int) -> None:
        """Samples/s of the attempt between two of its progress readings, recorded with the
        number of attempts on its card when both readings saw the same number."""
        step = (obs.last_progress or {}).get("step")
        # progress parsed from stdout is as old as the log's last write
        read_at = obs.last_progress_at if obs.last_progress_at is not None else obs.last_output_at
        if not isinstance(step, int) or isinstance(step, bool) or read_at is None:
            return
        previous = self._rates.get(attempt.id)
        self._rates[attempt.id] = (step, float(read_at), tenants)
        if previous is None or previous[2] != tenants or previous[:2] == (step, float(read_at)):
            return  # no second reading yet (progress is read again every few seconds)
        try:
            learn_rate(self.store, attempt, job, previous[:2], (step, float(read_at)), tenants, self.scheduler.shapes)
        except Exception:  # a bad config row must not stop reconciling the others
            log.warning("cannot record the rate of attempt %s", attempt.id, exc_info=True)
