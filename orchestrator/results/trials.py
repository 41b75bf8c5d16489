"""A search's trials, best first by the search metric: each trial's values, the mean over its
seeds of the metric's final value (only seeds that succeeded count; every other is named), and
the best trial. Pure: the jobs and their final values are given."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.lifecycle import JobState
from orchestrator.store.rows import Job


@dataclass(frozen=True)
class TrialRow:
    trial: int
    params: dict[str, Any]
    value: float | None  # the mean over the seeds counted; None: none counted
    counted: int
    submitted: int
    states: dict[str, int]  # what became of its jobs, by state

    def n_text(self) -> str:
        others = ", ".join(
            f"{n} {state}" for state, n in sorted(self.states.items()) if state != "succeeded"
        )
        return f"{self.counted} of {self.submitted}" + (f" ({others})" if others else "")


def trial_rows(jobs: Sequence[Job], values: Mapping[int, float], mode: str) -> list[TrialRow]:
    """One row per trial, best first (mode max or min); trials without a value last, by number."""
    # a trial is its number and its setting: trials of one number whose values differ (a `--set`
    # changed between submits, a search of an older version) are never pooled
    by_trial: dict[tuple[int, str], list[Job]] = {}
    for job in jobs:
        setting = json.dumps(job.overrides, sort_keys=True, default=str)
        by_trial.setdefault((int(job.search.get("trial", 0)), setting), []).append(job)
    keys = [d.get("key") for d in jobs[0].search.get("spec", {}).get("space", [])] if jobs else []
    rows = []
    for (number, _), members in by_trial.items():
        counted = [
            values[j.id] for j in members if j.state is JobState.SUCCEEDED and j.id in values
        ]
        states: dict[str, int] = {}
        for job in members:
            state = (
                job.state.value
                if job.state is not JobState.SUCCEEDED or job.id in values
                else "no metric"
            )
            states[state] = states.get(state, 0) + 1
        rows.append(
            TrialRow(
                number,
                {k: members[0].overrides.get(k) for k in keys},
                sum(counted) / len(counted) if counted else None,
                len(counted),
                len(members),
                states,
            )
        )
    sign = -1.0 if mode == "max" else 1.0
    return sorted(
        rows,
        key=lambda r: (r.value is None, sign * r.value if r.value is not None else 0.0, r.trial),
    )
