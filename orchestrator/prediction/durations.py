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


def _mean(entry: list[float]) -> float:
    """Mean of a [count, sum] entry."""
    return entry[1] / entry[0]


class DurationTable:
    """Means of completed run times, kept as running sums so that runs can be added one by one.

    Estimate for (config, task, level), first that applies:
    1. the mean of that exact shape;
    2. the mean of (config, task) at any level;
    3. the task's mean times the config's factor — the geometric mean of how much slower or
       faster than its task's mean each run of that config was (models differ in speed, tasks
       in data size, and the two multiply);
    4. the task's mean;
    otherwise None: nothing of that task has completed yet.
    """

    def __init__(self, runs: Iterable[CompletedRun] = ()) -> None:
        # key -> [count, sum of seconds]
        self._shape: dict[tuple[str, str, int], list[float]] = defaultdict(lambda: [0, 0.0])
        self._pair: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
        self._task: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        # config -> task -> [count, sum of log seconds]: the factor is recomputed from these
        # against the task means of the moment, as if every run were read again
        self._logs: dict[str, dict[str, list[float]]] = defaultdict(dict)
        self._factors: dict[str, float] = {}  # memo, cleared by `add`
        self._levels: dict[tuple[str, str], set[int]] = defaultdict(set)  # (config, task) -> levels run
        self._slowdowns: dict[tuple[str, int, int], float | None] = {}  # memo, cleared by `add`
        for run in runs:
            self.add(run)

    def add(self, run: CompletedRun) -> None:
        if run.duration_s <= 0:
            return
        for table, key in (
            (self._shape, (run.config, run.task, run.level)),
            (self._pair, (run.config, run.task)),
            (self._task, run.task),
        ):
            entry = table[key]  # type: ignore[index]
            entry[0] += 1
            entry[1] += run.duration_s
        logs = self._logs[run.config].setdefault(run.task, [0, 0.0])
        logs[0] += 1
        logs[1] += math.log(run.duration_s)
        self._factors.clear()
        self._levels[(run.config, run.task)].add(run.level)
        self._slowdowns.clear()

    def _config_factor(self, config: str) -> float:
        factor = self._factors.get(config)
        if factor is None:
            per_task = self._logs.get(config)
            if not per_task:
                return 1.0
            count = sum(n for n, _ in per_task.values())
            log_sum = sum(s - n * math.log(_mean(self._task[t])) for t, (n, s) in per_task.items())
            factor = self._factors[config] = math.exp(log_sum / count)
        return factor

    def expected_s(self, config: str, task: str, level: int) -> float | None:
        exact = self._shape.get((config, task, level))
        if exact is not None:
            return _mean(exact)
        pair = self._pair.get((config, task))
        if pair is not None:
            return _mean(pair)
        task_entry = self._task.get(task)
        if task_entry is None:
            return None
        return _mean(task_entry) * self._config_factor(config)

    def slowdown(self, config: str, from_level: int, to_level: int) -> float | None:
        """How much longer a run of `config` at `to_level` takes than one at `from_level`: the
        geometric mean, over its tasks that succeeded at both, of their mean run times' ratio (a
        rung's cost: checkpointing recomputes, fewer data workers wait on data); None while none
        ran at both. Per config: a level's index names another rung in another config's ladder
        (rungs that change nothing are skipped, and halving expands by the batch)."""
        key = (config, from_level, to_level)
        if key not in self._slowdowns:
            logs = [
                math.log(_mean(self._shape[(config, task, to_level)]) / _mean(self._shape[(config, task, from_level)]))
                for (of_config, task), levels in self._levels.items()
                if of_config == config and from_level in levels and to_level in levels
            ]
            self._slowdowns[key] = math.exp(sum(logs) / len(logs)) if logs else None
        return self._slowdowns[key]

    def expected_at_level_s(self, config: str, task: str, level: int, from_level: int) -> float | None:
        """The run time of a job now at `from_level` if it ran at `level` instead: the mean of that
        exact shape, else its estimate at `from_level` times the rungs' learned slowdown; None
        when either is unknown (a level's cost is never assumed)."""
        exact = self._shape.get((config, task, level))
        if exact is not None:
            return _mean(exact)
        base = self.expected_s(config, task, from_level)
        factor = self.slowdown(config, from_level, level)
        return None if base is None or factor is None else base * factor


def expected_duration_s(
    history: Iterable[CompletedRun], config: str, task: str, level: int
) -> float | None:
    """One-off estimate; build a `DurationTable` once when asking for many jobs."""
    return DurationTable(history).expected_s(config, task, level)
