"""A suite's `early_stop:` rule as written, checked: which metric, which way is better, which
Optuna pruner (asha, hyperband, median), the first step anything may be stopped at and the
reduction factor. Every problem is a PlanError naming it in one line, at submit."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from orchestrator.errors import PlanError
from orchestrator.plans.inputs import shown_typed, shown_value, yaml_number

MAX_REDUCTION_FACTOR = 100
MAX_STEPS = 10**9  # min_steps and max_steps: far past any run's length
MAX_SMOOTH_EVALS = 100  # a rung value averages at most this many evaluations of a seed
MAX_MARGIN_SE = 10.0  # standard errors: far past any margin that still stops anything
MAX_RUNGS = 64  # steps min_steps × factor^k past any worker's length are never reached


class PruneRule(str, Enum):
    ASHA = "asha"  # Optuna's SuccessiveHalvingPruner: keep the top 1/factor at each rung
    HYPERBAND = "hyperband"  # Optuna's HyperbandPruner: successive halving over several brackets
    MEDIAN = "median"  # Optuna's MedianPruner: stop below the median of finished settings


class Mode(str, Enum):
    MAX = "max"
    MIN = "min"


class SeedValue(str, Enum):
    """What a seed counts at a rung."""

    LAST = "last"  # its last evaluation at or before the rung step (or the mean of the last few)
    BEST = "best"  # its best evaluation at or before it: a loss that rises after warm-up and
    # comes down again is not judged at its bump


ChoiceT = TypeVar("ChoiceT", bound=Enum)


def _parse_choice(where: str, section: str, key: str, raw: dict[str, Any], default: ChoiceT) -> ChoiceT:
    """`key:` of a section, one of its enum's values (`default` when left out)."""
    choices = type(default)
    try:
        return choices(str(raw.get(key, default.value)))
    except ValueError:
        allowed = " or ".join(str(choice.value) for choice in choices)
        given = raw.get(key)
        shown = "null (an empty value)" if given is None else shown_value(str(given))
        raise PlanError(f"{where}: `{section}.{key}` must be {allowed}, not {shown}") from None


def parse_mode(where: str, section: str, raw: dict[str, Any]) -> Mode:
    """`mode:` of an `early_stop:` or `search:` section: max (the default) or min."""
    return _parse_choice(where, section, "mode", raw, Mode.MAX)


@dataclass(frozen=True)
class EarlyStop:
    metric: str
    mode: Mode
    rule: PruneRule
    min_steps: int
    reduction_factor: int = 3
    max_steps: int | None = None  # hyperband's largest budget; None: Optuna's "auto"
    # a seed's value at a rung: the mean of its last this many evaluations at or before the rung
    # step (1: its last one); a noisy evaluation then moves a rung value less
    smooth_evals: int = 1
    value: SeedValue = SeedValue.LAST
    # asha: a setting the pruner would stop at a rung goes on while its seed mean is within this
    # many standard errors (its seeds' spread there) of the rung's cutoff, the ceil(n / factor)-th
    # best (scheduling.early_stop.Margin)
    margin_se: float | None = None

    def __post_init__(self) -> None:
        if self.value is SeedValue.BEST and self.smooth_evals > 1:
            raise ValueError("early_stop: value best and smooth_evals above 1 do not combine")
        if self.margin_se is not None and (self.rule is not PruneRule.ASHA or not 0 <= self.margin_se <= MAX_MARGIN_SE):
            raise ValueError("early_stop: margin_se is asha's, from 0 to 10 standard errors")

    def best_of(self) -> Mode | None:
        """The direction a seed's best value so far is taken in; None: its last value counts."""
        return self.mode if self.value is SeedValue.BEST else None

    def rung_steps(self, up_to_step: float) -> list[int]:
        """The steps settings are compared at (min_steps × factor^k), up to `up_to_step`."""
        steps: list[int] = []
        step = self.min_steps
        while step <= up_to_step and len(steps) < MAX_RUNGS:
            steps.append(step)
            step *= self.reduction_factor
        return steps

    def to_json(self) -> dict[str, Any]:
        stored: dict[str, Any] = {
            "metric": self.metric,
            "mode": self.mode.value,
            "rule": self.rule.value,
            "min_steps": self.min_steps,
            "reduction_factor": self.reduction_factor,
        }
        if self.max_steps is not None:
            stored["max_steps"] = self.max_steps
        if self.smooth_evals != 1:  # a rule stored before the key existed reads as 1
            stored["smooth_evals"] = self.smooth_evals
        if self.value is not SeedValue.LAST:  # likewise: a rule stored before it reads as last
            stored["value"] = self.value.value
        if self.margin_se is not None:
            stored["margin_se"] = self.margin_se
        return stored

    def words(self) -> str:
        """The rule in the suite file's own keys, one line: `orch show` and `orch submit` say it."""
        return ", ".join(f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}"
                         for key, value in self.to_json().items())

    @classmethod
    def from_json(cls, stored: dict[str, Any]) -> EarlyStop | None:
        """As stored with a job; None for '{}' (no rule) or a record this orch cannot read."""
        if not stored:
            return None
        try:
            return parse_early_stop("stored early_stop", stored)
        except PlanError:
            return None


_KEYS = ("metric", "mode", "rule", "min_steps", "reduction_factor", "max_steps", "smooth_evals", "value", "margin_se")
_SHAPE = (
    "`early_stop` must be a mapping of metric, mode (max|min), rule (asha|hyperband|median), min_steps, "
    "reduction_factor, max_steps (hyperband), smooth_evals, value (last|best), margin_se (asha)"
)


def _bounded_int(where: str, key: str, value: Any, least: int, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise PlanError(
            f"{where}: `early_stop.{key}` must be an integer from {least} to {most}, not {shown_typed(value)}"
        )
    return value


def parse_early_stop(where: str, raw: Any) -> EarlyStop:
    """The checked rule; `where` starts each message (the suite file)."""
    if not isinstance(raw, dict):
        raise PlanError(f"{where}: {_SHAPE}, not {shown_value(str(raw))}")
    unknown = sorted(str(key) for key in raw if key not in _KEYS)
    if unknown:
        raise PlanError(f"{where}: `early_stop` has unknown key(s) {', '.join(unknown)} ({_SHAPE})")
    metric = raw.get("metric")
    if not isinstance(metric, str) or not metric.strip() or len(metric) > 200:
        raise PlanError(
            f"{where}: `early_stop.metric` must name a metric the worker reports over steps "
            "(e.g. val_accuracy)"
        )
    rules = "|".join(r.value for r in PruneRule)
    try:
        rule = PruneRule(str(raw.get("rule", "asha")))
    except ValueError:
        raise PlanError(
            f"{where}: unknown `early_stop.rule` {shown_value(str(raw.get('rule')))} ({rules})"
        ) from None
    mode = parse_mode(where, "early_stop", raw)
    if "min_steps" not in raw:
        raise PlanError(
            f"{where}: `early_stop.min_steps` is required: nothing is stopped before this step"
        )
    min_steps = _bounded_int(where, "min_steps", raw["min_steps"], 1, MAX_STEPS)
    factor = _bounded_int(where, "reduction_factor", raw.get("reduction_factor", 3), 2, MAX_REDUCTION_FACTOR)
    max_steps = raw.get("max_steps")
    if max_steps is not None:
        if rule is not PruneRule.HYPERBAND:
            raise PlanError(
                f"{where}: `early_stop.max_steps` is hyperband's largest budget; rule {rule.value} "
                "takes none"
            )
        max_steps = _bounded_int(where, "max_steps", max_steps, min_steps + 1, MAX_STEPS)
    smooth = _bounded_int(where, "smooth_evals", raw.get("smooth_evals", 1), 1, MAX_SMOOTH_EVALS)
    value = _parse_choice(where, "early_stop", "value", raw, SeedValue.LAST)
    if value is SeedValue.BEST and smooth > 1:
        raise PlanError(
            f"{where}: `early_stop.value: best` takes each seed's best value so far, "
            f"`smooth_evals: {smooth}` the mean of its last ones: choose one"
        )
    margin = _parse_margin(where, rule, raw.get("margin_se"))
    return EarlyStop(metric.strip(), mode, rule, min_steps, factor, max_steps, smooth, value, margin)


def _parse_margin(where: str, rule: PruneRule, margin: Any) -> float | None:
    if margin is None:
        return None
    margin = yaml_number(margin)  # `5e-1` is text to YAML
    if rule is not PruneRule.ASHA:
        raise PlanError(
            f"{where}: `early_stop.margin_se` spares settings near asha's cutoff; rule {rule.value} takes none"
        )
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not 0 <= margin <= MAX_MARGIN_SE:
        raise PlanError(
            f"{where}: `early_stop.margin_se` must be a number of standard errors from 0 to "
            f"{MAX_MARGIN_SE:g}, not {shown_typed(margin)}"
        )
    return float(margin)


def describe_pruned(record: dict[str, Any]) -> str:
    """"pruned at step 400 (val_accuracy 0.52 (the setting's mean over its seeds), ranked 7 of 9 at that
    step; asha)": the value the setting was judged on, not the job's own reading."""
    step, value = record.get("step"), record.get("value")
    shown_step = f"{float(step):g}" if isinstance(step, (int, float)) else "?"
    shown_value = f"{float(value):.4g}" if isinstance(value, (int, float)) else "?"
    rank = (f", ranked {record['rank']} of {record['of']} at that step"
            if isinstance(record.get("rank"), int) and isinstance(record.get("of"), int) else "")
    rule = f"; {record['rule']}" if isinstance(record.get("rule"), str) else ""
    smooth = record.get("smooth_evals")
    # the setting's value, judged on its seeds' mean: not this job's own reading
    mean_of = " (the setting's mean over its seeds)"
    if isinstance(smooth, int) and smooth > 1:
        mean_of = f" (the setting's mean over its seeds of the last {smooth} evaluations)"
    if record.get("seed_value") == "best":
        mean_of = " (the setting's mean of each seed's best so far)"
    return f"pruned at step {shown_step} ({record.get('metric', '?')} {shown_value}{mean_of}{rank}{rule})"
