"""Expected run time of a queued job, learned from the attempts that succeeded.

Pure: the daemon (from its attempts table) and the packing benchmark (from simulated attempts)
both build a `DurationTable` from `CompletedRun`s and ask it for estimates. Nothing here knows a
job's true run time; a shape never seen completed gets an estimate only through its task.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class CompletedRun:
    config: str  # the suite's config name
    task: str  # the job's data (GLUE task, dataset name)
    level: int  # ladder level the attempt ran at
    duration_s: float  # wall time, start to success


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


class DurationTable:
    """Means of completed run times, indexed for one scheduling pass.

    Estimate for (config, task, level), first that applies:
    1. the mean of that exact shape;
    2. the mean of (config, task) at any level;
    3. the task's mean times the config's factor — the geometric mean of how much slower or
       faster than its task's mean each run of that config was (models differ in speed, tasks
       in data size, and the two multiply);
    4. the task's mean;
    otherwise None: nothing of that task has completed yet.
    """

    def __init__(self, runs: Iterable[CompletedRun]) -> None:
        by_shape: dict[tuple[str, str, int], list[float]] = defaultdict(list)
        by_pair: dict[tuple[str, str], list[float]] = defaultdict(list)
        by_task: dict[str, list[float]] = defaultdict(list)
        kept = [r for r in runs if r.duration_s > 0]
        for r in kept:
            by_shape[(r.config, r.task, r.level)].append(r.duration_s)
            by_pair[(r.config, r.task)].append(r.duration_s)
            by_task[r.task].append(r.duration_s)
        self._shape = {k: _mean(v) for k, v in by_shape.items()}
        self._pair = {k: _mean(v) for k, v in by_pair.items()}
        self._task = {k: _mean(v) for k, v in by_task.items()}
        log_ratios: dict[str, list[float]] = defaultdict(list)
        for r in kept:
            log_ratios[r.config].append(math.log(r.duration_s / self._task[r.task]))
        self._config_factor = {k: math.exp(_mean(v)) for k, v in log_ratios.items()}

    def expected_s(self, config: str, task: str, level: int) -> float | None:
        exact = self._shape.get((config, task, level))
        if exact is not None:
            return exact
        pair = self._pair.get((config, task))
        if pair is not None:
            return pair
        task_mean = self._task.get(task)
        if task_mean is None:
            return None
        return task_mean * self._config_factor.get(config, 1.0)


def expected_duration_s(
    history: Iterable[CompletedRun], config: str, task: str, level: int
) -> float | None:
    """One-off estimate; build a `DurationTable` once when asking for many jobs."""
    return DurationTable(history).expected_s(config, task, level)
