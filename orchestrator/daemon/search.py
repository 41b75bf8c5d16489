"""The daemon's search step: for each TPE search with fewer trials than it asks for and no job
left in the queue, tell a fresh TPE sampler every finished trial (from the store: each job's
final value of the search metric, the mean over the trial's seeds) and queue the trial it asks
for. A failure here never holds up the pass."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence

from orchestrator import faults
from orchestrator.lifecycle import TERMINAL_STATES, JobState
from orchestrator.plans.search import Search
from orchestrator.plans.trial_sampling import FinishedTrial, TrialEnd, next_trial
from orchestrator.store.db import Store
from orchestrator.store.early_stop import reported_keys
from orchestrator.store.jobs import add_event
from orchestrator.store.rows import Job
from orchestrator.store.search import final_values, queue_trial, tpe_search_jobs

log = logging.getLogger(__name__)

CHECK_EVERY_S = 2.0


def finished_trials(
    search: Search, trials: dict[int, list[Job]], values: dict[int, float]
) -> list[FinishedTrial]:
    """The trials whose every job has ended, with what the sampler is told of each."""
    found = []
    for number, jobs in sorted(trials.items()):
        if not all(job.state in TERMINAL_STATES for job in jobs):
            continue
        params = {dim.key: jobs[0].overrides.get(dim.key) for dim in search.space}
        if any(job.state is JobState.PRUNED for job in jobs):
            found.append(FinishedTrial(number, params, TrialEnd.PRUNED))
        elif all(job.state is JobState.SUCCEEDED and job.id in values for job in jobs):
            mean = sum(values[job.id] for job in jobs) / len(jobs)
            found.append(FinishedTrial(number, params, TrialEnd.COMPLETE, mean))
        else:
            found.append(FinishedTrial(number, params, TrialEnd.FAILED))
    return found


class SearchRunner:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._next_check_s = 0.0
        self._done: set[tuple[str, str]] = set()  # searches that have all their trials
        self._told: dict[tuple[str, str], str] = {}  # search -> the failure an event said, while it lasts
        self._unreported: set[tuple[str, str]] = set()  # searches whose missing metric an event said

    def check(self) -> None:
        if time.monotonic() < self._next_check_s:
            return
        self._next_check_s = time.monotonic() + CHECK_EVERY_S
        groups: dict[tuple[str, str], list[Job]] = {}
        for job in tpe_search_jobs(self.store):
            groups.setdefault(
                (job.suite, json.dumps(job.search.get("spec"), sort_keys=True)), []
            ).append(job)
        for key, jobs in groups.items():
            if key in self._done:
                continue
            try:
                self._advance(key, jobs)
            except Exception as exc:
                log.exception(
                    "the search of suite %s failed to ask for a trial; tried again", key[0]
                )
                self._tell(key, f"{type(exc).__name__}: {exc}")
            else:
                self._told.pop(key, None)  # it asks again: a later failure is told anew

    def _tell(self, key: tuple[str, str], error: str) -> None:
        """One event per search and error while it keeps failing: a search that cannot go on
        shows in `orch status`, not only in the daemon's log."""
        if self._told.get(key) == error:
            return
        self._told[key] = error
        message = f"the search of suite {key[0]} cannot ask for its next trial (tried again every pass): {error}"
        try:
            with self.store.write():
                add_event(self.store, "search", message[:500])
        except Exception:
            log.warning("cannot record the search's failure", exc_info=True)

    def _say_unreported(
        self, key: tuple[str, str], metric: str, trials: dict[int, list[Job]], values: dict[int, float]
    ) -> None:
        """One event per search when a trial succeeded without its metric: TPE is told it failed,
        so a metric the worker never writes (a typo) leaves the search asking at random."""
        silent = [
            number for number, jobs in sorted(trials.items())
            if all(job.state is JobState.SUCCEEDED for job in jobs) and not any(job.id in values for job in jobs)
        ]  # fmt: skip
        if not silent or key in self._unreported:
            return
        self._unreported.add(key)
        reported = ", ".join(reported_keys(self.store, [job.id for job in trials[silent[0]]])) or "nothing"
        with self.store.write():
            add_event(self.store, "search", f"the search of suite {key[0]}: trial {silent[0]} succeeded without "
                                            f"reporting {metric!r} (reported: {reported}); TPE is told it failed, "
                                            "so it asks at random until a trial reports it")  # fmt: skip

    def _advance(self, key: tuple[str, str], jobs: Sequence[Job]) -> None:
        search = Search.from_json(jobs[0].search["spec"])
        trials: dict[int, list[Job]] = {}
        for job in jobs:
            trials.setdefault(int(job.search.get("trial", 0)), []).append(job)
        if len(trials) >= search.trials:
            self._done.add(key)
            return
        if any(job.state is JobState.QUEUED for job in jobs):
            return  # a slot has yet to take the last trial asked for
        metric = search.metric or ""
        values = final_values(self.store, [job.id for job in jobs], metric)
        self._say_unreported(key, metric, trials, values)
        number = max(trials) + 1
        params = next_trial(search, finished_trials(search, trials, values), number)
        first = trials[min(trials)]
        queued = queue_trial(self.store, first, params, number)
        faults.reach("after_trial_queued")
        log.info("search of suite %s: trial %d queued (jobs %s)", key[0], number, queued)
