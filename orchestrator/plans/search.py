"""A suite's `search:` as written, checked: random or TPE search over a space of config keys,
on Optuna's samplers. Keys are checked like `--grid` keys (known to the configs, typed by
them; the worker command must receive them, checked at submit with the template). Every
problem is a PlanError naming it in one line."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

from orchestrator.errors import PlanError
from orchestrator.plans.early_stop import Mode, parse_mode
from orchestrator.plans.grid import MAX_GRID_JOBS, config_type
from orchestrator.plans.inputs import PAIR_KEYS, Scalar, shown_typed, shown_value, yaml_number
from orchestrator.plans.model import ConfigSpec
from orchestrator.plans.spelling import did_you_mean


class SearchMethod(str, Enum):
    RANDOM = "random"  # every trial drawn at submit by a seeded RandomSampler: the same trials every time
    TPE = "tpe"  # the next trial asked of a TPESampler when the search's queue empties, from finished trials


class Distribution(str, Enum):
    UNIFORM = "uniform"
    LOG_UNIFORM = "log_uniform"
    INT_UNIFORM = "int_uniform"
    CHOICE = "choice"  # written as a list of values


@dataclass(frozen=True)
class Dimension:
    key: str
    distribution: Distribution
    low: float = 0.0
    high: float = 0.0
    choices: tuple[Scalar, ...] = ()

    def to_json(self) -> dict[str, Any]:
        if self.distribution is Distribution.CHOICE:
            return {"key": self.key, "choice": list(self.choices)}
        if self.distribution is Distribution.INT_UNIFORM:  # read back, its bounds must be integers
            return {"key": self.key, self.distribution.value: [int(self.low), int(self.high)]}
        return {"key": self.key, self.distribution.value: [self.low, self.high]}


@dataclass(frozen=True)
class Search:
    method: SearchMethod
    trials: int
    seed: int
    metric: str | None
    mode: Mode
    space: tuple[Dimension, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method.value,
            "trials": self.trials,
            "seed": self.seed,
            "metric": self.metric,
            "mode": self.mode.value,
            "space": [d.to_json() for d in self.space],
        }

    @classmethod
    def from_json(cls, stored: dict[str, Any]) -> Search:
        space = {}
        for item in stored.get("space", []):
            key = item["key"]
            space[key] = (
                item["choice"]
                if "choice" in item
                else {k: _stored_bounds(k, v) for k, v in item.items() if k != "key"}
            )
        raw = {k: v for k, v in stored.items() if k != "space"} | {"space": space}
        return _parse(raw, "stored search", None, None)


_KEYS = ("method", "trials", "seed", "metric", "mode", "space")


def _stored_bounds(distribution: str, bounds: Any) -> Any:
    """int_uniform bounds as stored before they were kept as integers (`[0.0, 8.0]`)."""
    if distribution == Distribution.INT_UNIFORM.value and isinstance(bounds, list):
        return [int(b) if isinstance(b, float) and b.is_integer() else b for b in bounds]
    return bounds


def parse_search(where: str, raw: Any, known: set[str], configs: tuple[ConfigSpec, ...]) -> Search:
    """The checked `search:`; `known`: the config keys a `--grid` may name."""
    return _parse(raw, where, known, configs)


def _parse(
    raw: Any, where: str, known: set[str] | None, configs: tuple[ConfigSpec, ...] | None
) -> Search:
    if not isinstance(raw, dict):
        raise PlanError(
            f"{where}: `search` must be a mapping of method, trials, seed, metric, mode, space"
        )
    unknown = sorted(str(k) for k in raw if k not in _KEYS)
    if unknown:
        raise PlanError(
            f"{where}: `search` has unknown key(s) {', '.join(unknown)} (method, trials, seed, metric, "
            "mode, space)"
        )
    try:
        method = SearchMethod(str(raw.get("method")))
    except ValueError:
        raise PlanError(
            f"{where}: unknown `search.method` {shown_value(str(raw.get('method')))} (random|tpe)"
        ) from None
    trials = raw.get("trials")
    if trials is None:
        raise PlanError(f"{where}: `search.trials` is required: how many trials to draw (1 to {MAX_GRID_JOBS})")
    if isinstance(trials, bool) or not isinstance(trials, int) or not 1 <= trials <= MAX_GRID_JOBS:
        raise PlanError(
            f"{where}: `search.trials` must be an integer between 1 and {MAX_GRID_JOBS} (the submit "
            f"cap), not {shown_typed(trials)}"
        )
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise PlanError(f"{where}: `search.seed` must be an integer between 0 and 2^32 - 1")
    metric = raw.get("metric")
    if metric is not None and (not isinstance(metric, str) or not metric.strip()):
        raise PlanError(
            f"{where}: `search.metric` must name a metric the worker reports (e.g. val_accuracy)"
        )
    if method is SearchMethod.TPE and metric is None:
        raise PlanError(
            f"{where}: `search.metric` is required for tpe: the final value it optimises"
        )
    mode = parse_mode(where, "search", raw)
    space = raw.get("space")
    if not isinstance(space, dict) or not space:
        raise PlanError(
            f"{where}: `search.space` must map config keys to a list of values or "
            "{uniform|log_uniform|int_uniform: [low, high]}"
        )
    dims = tuple(_dimension(where, str(key), value, known, configs) for key, value in space.items())
    return Search(method, trials, seed, metric.strip() if metric else None, mode, dims)


def _dimension(
    where: str, key: str, raw: Any, known: set[str] | None, configs: tuple[ConfigSpec, ...] | None
) -> Dimension:
    flag = f"{where}: `search.space.{key}`"
    if key in PAIR_KEYS:
        raise PlanError(
            f"{flag}: seed and data come from the pairs (or the suite's seeds: and tasks:)"
        )
    if known is not None and key not in known:
        raise PlanError(
            f"{where}: `search.space` names unknown config key {shown_value(key)}{did_you_mean([key], known)} "
            f"(known: {', '.join(sorted(known))})"
        )
    kind = config_type(key, configs) if configs is not None else None
    if isinstance(raw, list):
        if (
            not raw
            or len(raw) > 1000
            or not all(isinstance(v, (str, int, float, bool)) for v in raw)
        ):
            raise PlanError(f"{flag} must list 1 to 1000 scalar values")
        for value in raw:
            _check_kind(flag, value, kind)
        return Dimension(key, Distribution.CHOICE, choices=tuple(raw))
    if not isinstance(raw, dict) or len(raw) != 1:
        raise PlanError(
            f"{flag} must be a list of values or one of uniform, log_uniform, int_uniform: [low, high]"
        )
    ((name, bounds),) = raw.items()
    if isinstance(bounds, list):  # YAML reads `1e-5` (no dot) as text: a number written so is one
        bounds = [yaml_number(b) for b in bounds]
    try:
        distribution = Distribution(str(name))
    except ValueError:
        distribution = Distribution.CHOICE
    if distribution is Distribution.CHOICE:
        raise PlanError(
            f"{flag}: unknown distribution {shown_value(str(name))} (uniform, log_uniform, int_uniform, "
            "or a list of values)"
        )
    if (
        not isinstance(bounds, list)
        or len(bounds) != 2
        or not all(
            isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b)
            for b in bounds
        )
    ):
        raise PlanError(f"{flag}: {distribution.value} takes [low, high], two finite numbers")
    low, high = float(bounds[0]), float(bounds[1])
    if low >= high:
        raise PlanError(f"{flag}: low {bounds[0]} must be below high {bounds[1]}")
    if distribution is Distribution.LOG_UNIFORM and low <= 0:
        raise PlanError(f"{flag}: log_uniform needs bounds above 0, not {bounds[0]}")
    if distribution is Distribution.INT_UNIFORM and not all(isinstance(b, int) for b in bounds):
        raise PlanError(f"{flag}: int_uniform takes two integers")
    if kind in (str, bool) or (kind is int and distribution is not Distribution.INT_UNIFORM):
        raise PlanError(
            f"{flag}: {key} is {kind.__name__ if kind else '?'} in the configs; "
            f"{distribution.value} draws {'integers' if distribution is Distribution.INT_UNIFORM else 'floats'}"
        )
    return Dimension(key, distribution, low, high)


def _check_kind(flag: str, value: Scalar, kind: type | None) -> None:
    if kind is None:
        return
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = (
        isinstance(value, bool)
        if kind is bool
        else isinstance(value, str)
        if kind is str
        else numeric and (kind is float or isinstance(value, int))
    )
    if not ok:
        raise PlanError(
            f"{flag}: {shown_value(str(value))} is not {kind.__name__}, the type the configs give it"
        )
