"""Trials of a `search:` from values alone, on Optuna's samplers through ask and tell: a seeded
random search's every trial (at submit), and a TPE search's next trial from the trials that
have finished (the daemon reads them from the store and writes the new trial's jobs)."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from orchestrator.plans.early_stop import Mode
from orchestrator.plans.inputs import Scalar
from orchestrator.plans.optuna_lib import load_optuna
from orchestrator.plans.search import Dimension, Distribution, Search

SIGNIFICANT_DIGITS = (
    6  # a drawn float is kept to this many digits: what the job runs and results name
)
DRAWS_PER_TRIAL = 50  # a random search draws at most this many times its trials to find them distinct


class TrialEnd(str, Enum):
    COMPLETE = (
        "complete"  # every seed succeeded with the metric: told the mean of their final values
    )
    PRUNED = "pruned"  # stopped by early stopping
    FAILED = "failed"  # no value: failed, cancelled, or the metric never reported


@dataclass(frozen=True)
class FinishedTrial:
    number: int
    params: dict[str, Scalar]
    end: TrialEnd
    value: float | None = None


def distributions(search: Search) -> dict[str, Any]:
    optuna = load_optuna()
    found: dict[str, Any] = {}
    for dim in search.space:
        if dim.distribution is Distribution.CHOICE:
            found[dim.key] = optuna.distributions.CategoricalDistribution(list(dim.choices))
        elif dim.distribution is Distribution.INT_UNIFORM:
            found[dim.key] = optuna.distributions.IntDistribution(int(dim.low), int(dim.high))
        else:
            found[dim.key] = optuna.distributions.FloatDistribution(
                dim.low, dim.high, log=dim.distribution is Distribution.LOG_UNIFORM
            )
    return found


def _kept(value: Any, dim: Dimension) -> Scalar:
    """The value a job runs: a float to SIGNIFICANT_DIGITS, inside its bounds."""
    if dim.distribution in (Distribution.UNIFORM, Distribution.LOG_UNIFORM):
        rounded = float(f"{float(value):.{SIGNIFICANT_DIGITS}g}")
        return min(max(rounded, dim.low), dim.high)
    if dim.distribution is Distribution.INT_UNIFORM:
        return int(value)
    return value


def _params(trial: Any, search: Search, found: dict[str, Any]) -> dict[str, Scalar]:
    return {dim.key: _kept(trial.params[dim.key], dim) for dim in search.space if dim.key in found}


def space_size(search: Search) -> int | None:
    """How many settings the space holds; None when a dimension is continuous."""
    size = 1
    for dim in search.space:
        if dim.distribution is Distribution.CHOICE:
            size *= len(dim.choices)
        elif dim.distribution is Distribution.INT_UNIFORM:
            size *= int(dim.high) - int(dim.low) + 1
        else:
            return None
    return size


def random_trials(search: Search) -> list[dict[str, Scalar]]:
    """Every trial of a random search, each a setting no earlier trial has: the same list for
    the same search (its seed). A space of no more settings than `trials` gives them all, in
    its own order (fewer trials: the caller says so); a draw that repeats a setting is drawn
    again."""
    size = space_size(search)
    if size is not None and size <= search.trials:
        return [dict(zip([d.key for d in search.space], values, strict=True))
                for values in itertools.product(*(_values(d) for d in search.space))]  # fmt: skip
    optuna = load_optuna()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=search.seed))
    found = distributions(search)
    trials: list[dict[str, Scalar]] = []
    seen: set[str] = set()
    for _ in range(search.trials * DRAWS_PER_TRIAL):
        params = _params(study.ask(found), search, found)
        key = json.dumps(params, sort_keys=True)
        if key not in seen:
            seen.add(key)
            trials.append(params)
            if len(trials) == search.trials:
                break
    return trials


def trial_seed(seed: int, number: int) -> int:
    """The sampler's seed for trial `number` of a search seeded `seed`: trial 0's is the seed
    (as it always was: a search submitted again queues the same trial 0), a later trial's is
    drawn from both. With `seed + number` trial n of seed s was the first trial of seed s + n,
    and the searches of nearby seeds shared most of their random start-up trials."""
    if number == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}:{number}".encode()).digest()[:4], "big")


def _values(dim: Dimension) -> list[Scalar]:
    """Every value of a finite dimension (a choice, an int_uniform)."""
    if dim.distribution is Distribution.CHOICE:
        return list(dim.choices)
    return list(range(int(dim.low), int(dim.high) + 1))


def _direction(search: Search) -> str:
    return "maximize" if search.mode is Mode.MAX else "minimize"


def next_trial(search: Search, finished: Sequence[FinishedTrial], number: int) -> dict[str, Scalar]:
    """Trial `number` of a TPE search, asked of a TPESampler told each finished trial once (a
    study rebuilt from them at every ask: no trial told twice, none lost after a restart)."""
    optuna = load_optuna()
    found = distributions(search)
    study = optuna.create_study(
        direction=_direction(search), sampler=optuna.samplers.TPESampler(seed=trial_seed(search.seed, number))
    )
    for trial in sorted(finished, key=lambda t: t.number):
        params = {k: v for k, v in trial.params.items() if k in found}
        if len(params) != len(found):
            continue  # a trial of another space (the suite's search changed): not told
        told = _told(optuna, trial)
        try:
            study.add_trial(optuna.trial.create_trial(params=params, distributions=found, **told))
        except ValueError:
            continue  # a value outside the space as it is now: not told
    return _params(study.ask(found), search, found)


def _told(optuna: Any, trial: FinishedTrial) -> dict[str, Any]:
    """What the sampler is told of a finished trial: its value, or that it was pruned or failed."""
    if trial.end is TrialEnd.COMPLETE and trial.value is not None and math.isfinite(trial.value):
        return {"value": trial.value}
    if trial.end is TrialEnd.PRUNED:
        return {"state": optuna.trial.TrialState.PRUNED}
    return {"state": optuna.trial.TrialState.FAIL}
