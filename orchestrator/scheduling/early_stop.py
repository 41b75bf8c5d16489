"""Which settings early stopping stops, from values alone: each setting's seeds with their
metric by step, and what the pruner was told before. No store, clock or process: the daemon
(`orchestrator.daemon.early_stop`) reads, calls `judge`, and writes.

The algorithms are Optuna's (SuccessiveHalvingPruner for asha, HyperbandPruner, MedianPruner),
driven through its ask-and-tell interface on an in-memory study rebuilt at every call: one trial
per setting, told the setting's value at each rung step (min_steps × factor^k). A setting's
value at a step is the mean over its seeds of each seed's last value at or before that step (its
best there with `value: best`), once every seed that counts (queued, running or succeeded) has
reported the metric at or past it. What was told before is told again first, in the same order
of rungs, so a restarted daemon's pruner holds what the last one's did; only then are new rungs
told, and judged. With `margin_se` (asha) a stop the pruner decides is not made for a setting tied
with the rung's cutoff within its seeds' noise (`Margin`)."""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.lifecycle import JobState
from orchestrator.plans.early_stop import EarlyStop, Mode, PruneRule
from orchestrator.plans.optuna_lib import load_optuna
from orchestrator.spread import sample_std
from orchestrator.store.early_stop import RungValue

COUNTED = (
    JobState.QUEUED,
    JobState.RUNNING,
    JobState.SUCCEEDED,
)  # seeds a setting's mean waits for
MEDIAN_STARTUP_SETTINGS = 2  # finished settings the median rule needs before it stops any


@dataclass(frozen=True)
class SeedRun:
    job_id: int
    state: JobState
    values: Mapping[float, float]  # step -> the metric at that step
    reached_step: float = 0.0  # the furthest step any of its metrics was reported at


@dataclass(frozen=True)
class SettingRuns:
    """One setting (a config and its overrides) of one suite and task, with its seeds."""

    key: str
    seeds: tuple[SeedRun, ...]
    decided: bool = False  # pruned before (or retried after its prune): never judged again

    def counted(self) -> list[SeedRun]:
        return [seed for seed in self.seeds if seed.state in COUNTED]

    def finished(self) -> bool:
        counted = self.counted()
        return bool(counted) and all(seed.state is JobState.SUCCEEDED for seed in counted)

    def live_job_ids(self) -> list[int]:
        return [
            seed.job_id for seed in self.seeds if seed.state in (JobState.QUEUED, JobState.RUNNING)
        ]


@dataclass(frozen=True)
class Prune:
    setting: str
    job_ids: tuple[int, ...]
    rung: int
    step: int
    value: float
    rank: int  # 1 is the best of the settings told at that rung
    of: int

    def record(self, spec: EarlyStop) -> dict[str, Any]:
        smooth = {"smooth_evals": spec.smooth_evals} if spec.smooth_evals > 1 else {}
        best = {"seed_value": spec.value.value} if spec.best_of() is not None else {}
        margin = {"margin_se": spec.margin_se} if spec.margin_se is not None else {}
        return {
            "step": self.step,
            "metric": spec.metric,
            "value": self.value,
            "rank": self.rank,
            "of": self.of,
            "rule": spec.rule.value,
            "rung": self.rung,
        } | smooth | best | margin


@dataclass(frozen=True)
class Spared:
    """A stop the pruner decided and `margin_se` did not make: the setting, where, its value, the
    rung's cutoff and the setting's standard error there (None: it is as good as the cutoff)."""

    setting: str
    step: int
    value: float
    cutoff: float
    standard_error: float | None


@dataclass
class Judgement:
    prunes: list[Prune] = field(default_factory=list)
    told: list[RungValue] = field(default_factory=list)  # new rung values, to be kept
    metric_missing_at: int | None = None  # a seed passed the first rung step without the metric
    spared: list[Spared] = field(default_factory=list)  # by the margin, this judgement


def value_at(
    values: Mapping[float, float], step: float, smooth_evals: int = 1, best_of: Mode | None = None
) -> float | None:
    """A seed's metric at `step`, once it reported at or past it: its last value at or before
    it, or the mean of its last `smooth_evals` values there (fewer where it has fewer), or with
    `best_of` its best value there in that direction."""
    if not values or max(values) < step:
        return None
    earlier = sorted(s for s in values if s <= step)
    if best_of is not None and earlier:
        pick = max if best_of is Mode.MAX else min
        return pick(float(values[s]) for s in earlier)
    earlier = earlier[-smooth_evals:]
    return sum(float(values[s]) for s in earlier) / len(earlier) if earlier else None


def setting_value(
    setting: SettingRuns, step: float, smooth_evals: int = 1, best_of: Mode | None = None
) -> float | None:
    """The mean over the setting's counted seeds at `step`; None until every one has it."""
    found = seed_values(setting, step, smooth_evals, best_of)
    if not found or len(found) < len(setting.counted()):
        return None
    return sum(found) / len(found)


def seed_values(
    setting: SettingRuns, step: float, smooth_evals: int = 1, best_of: Mode | None = None
) -> list[float]:
    """The finite values at `step` of the setting's counted seeds (what its mean is made of)."""
    found = [value_at(seed.values, step, smooth_evals, best_of) for seed in setting.counted()]
    return [v for v in found if v is not None and math.isfinite(v)]


class Margin:
    """`early_stop.margin_se` (asha): a stop the pruner decides at a rung is not made while the
    setting is as good as the cutoff, the ceil(n / factor)-th best of the n settings told at that
    rung (itself among them; where n / factor is not whole, one more setting than the pruner
    keeps: `margin_se: 0` spares that one), or within `margin_se` standard errors of it: its
    seeds' sample standard deviation at the rung step over √seeds (0 with one seed). The pruner
    decides; the margin only spares, and a spared setting is judged again as any other. Ties
    with the cutoff within seed noise were what lost the grid's best (docs/search.md)."""

    def __init__(self, spec: EarlyStop, settings: Sequence[SettingRuns]) -> None:
        self.spec = spec
        self.by_key = {setting.key: setting for setting in settings}

    def spare(self, key: str, step: int, value: float, told: Mapping[str, float]) -> Spared | None:
        """The setting spared at this rung, or None where the pruner's stop stands."""
        spec = self.spec
        ranked = sorted(told.values(), reverse=spec.mode is Mode.MAX)  # best first
        cutoff = ranked[max(1, math.ceil(len(ranked) / spec.reduction_factor)) - 1]
        gap = cutoff - value if spec.mode is Mode.MAX else value - cutoff
        if gap <= 0:
            return Spared(key, step, value, cutoff, None)
        setting = self.by_key.get(key)
        found = seed_values(setting, step, spec.smooth_evals, spec.best_of()) if setting else []
        if len(found) < 2:
            return None
        standard_error = sample_std(found) / math.sqrt(len(found))  # values up to 1e300: never an OverflowError
        within = gap <= (spec.margin_se or 0.0) * standard_error
        return Spared(key, step, value, cutoff, standard_error) if within else None


def _pruner(spec: EarlyStop) -> Any:
    pruners = load_optuna().pruners
    if spec.rule is PruneRule.ASHA:
        return pruners.SuccessiveHalvingPruner(
            min_resource=spec.min_steps,
            reduction_factor=spec.reduction_factor,
            min_early_stopping_rate=0,
            bootstrap_count=0,
        )
    if spec.rule is PruneRule.HYPERBAND:
        return pruners.HyperbandPruner(
            min_resource=spec.min_steps,
            max_resource=spec.max_steps or "auto",
            reduction_factor=spec.reduction_factor,
        )
    return pruners.MedianPruner(
        n_startup_trials=MEDIAN_STARTUP_SETTINGS, n_warmup_steps=spec.min_steps
    )


def _rank(value: float, others: Sequence[float], mode: Mode) -> int:
    better = [v for v in others if (v > value if mode is Mode.MAX else v < value)]
    return 1 + len(better)


def judge(
    spec: EarlyStop, settings: Sequence[SettingRuns], told_before: Sequence[RungValue]
) -> Judgement:
    """The settings to stop now and the rung values newly told. `settings` in a fixed order
    (their first job's id): the order Optuna numbers its trials in, and breaks ties by."""
    optuna = load_optuna()
    study = optuna.create_study(
        study_name="early_stop",
        pruner=_pruner(spec),
        sampler=optuna.samplers.RandomSampler(seed=0),
        direction="maximize" if spec.mode is Mode.MAX else "minimize",
    )
    trials = {setting.key: study.ask() for setting in settings}
    at_rung: dict[int, dict[str, float]] = {}
    told_rungs: dict[str, set[int]] = {}
    for earlier in sorted(told_before, key=lambda r: (r.rung, r.setting)):
        trial = trials.get(earlier.setting)
        at_rung.setdefault(earlier.rung, {})[earlier.setting] = earlier.value
        told_rungs.setdefault(earlier.setting, set()).add(earlier.rung)
        if trial is not None:  # told again as before; what it says now was decided then
            trial.report(earlier.value, int(earlier.step))
            trial.should_prune()
    judgement = Judgement()
    reached = max((seed.reached_step for s in settings for seed in s.seeds), default=0.0)
    if any(
        seed.reached_step >= spec.min_steps and not seed.values
        for s in settings
        for seed in s.counted()
    ):
        judgement.metric_missing_at = spec.min_steps
    new: list[tuple[int, int, SettingRuns, float]] = []
    for setting in settings:
        if setting.decided:
            continue
        for rung, step in enumerate(spec.rung_steps(reached)):
            if rung in told_rungs.get(setting.key, set()):
                continue
            value = setting_value(setting, step, spec.smooth_evals, spec.best_of())
            if value is None:
                break
            new.append((rung, step, setting, value))
    order = {s.key: i for i, s in enumerate(settings)}
    new.sort(key=lambda item: (item[0], order[item[2].key]))
    # a finished setting is told its last rungs and its end first: the median rule compares with it
    for rung, step, setting, value in [item for item in new if item[2].finished()]:
        trials[setting.key].report(value, step)
        judgement.told.append(RungValue(setting.key, rung, float(step), value))
        at_rung.setdefault(rung, {})[setting.key] = value
    for setting in settings:
        final = final_value(setting) if setting.finished() and not setting.decided else None
        if final is not None:
            study.tell(trials[setting.key], final)
    live = [item for item in new if not item[2].finished()]
    stopped: set[str] = set()
    margin = Margin(spec, settings) if spec.margin_se is not None else None
    for rung in sorted({item[0] for item in live}):
        batch = [item for item in live if item[0] == rung and item[2].key not in stopped]
        for prune in _judge_rung(study, trials, spec, batch, at_rung, judgement, margin):
            stopped.add(prune.setting)
            judgement.prunes.append(prune)
    if (
        spec.rule is not PruneRule.HYPERBAND
    ):  # a bracket's rungs are its own: judged as they come only
        for prune in _judge_again(study, trials, spec, settings, at_rung, margin, judgement.spared):
            if prune.setting not in stopped:
                stopped.add(prune.setting)
                judgement.prunes.append(prune)
    return judgement


def _judge_again(
    study: Any,
    trials: Mapping[str, Any],
    spec: EarlyStop,
    settings: Sequence[SettingRuns],
    at_rung: Mapping[int, Mapping[str, float]],
    margin: Margin | None = None,
    spared: list[Spared] | None = None,
) -> list[Prune]:
    """Each running setting judged by the pruner again at the last rung it has reached, against
    every setting that has reached that rung by now: one that went on for being among the first
    there is stopped once better ones arrive (a grid queued in order of its values would
    otherwise keep every setting better than those before it). Only there: a setting among the
    best at a later rung is never stopped for where it stood at an earlier one (judged again at
    every rung it passed, the leaders of the later rungs could all be stopped, and the grid with
    them)."""
    prunes: list[Prune] = []
    everyone = study.get_trials(deepcopy=True)
    steps = spec.rung_steps(
        max((max(v) for v in (s.values for st in settings for s in st.seeds) if v), default=0.0)
    )
    for setting in settings:
        if setting.decided or setting.finished() or not setting.live_job_ids():
            continue
        trial = everyone[trials[setting.key].number]
        values, attrs = dict(trial.intermediate_values), dict(trial.system_attrs)
        reached = [rung for rung in range(len(steps)) if setting.key in at_rung.get(rung, {})]
        if not reached:
            continue
        rung, step = reached[-1], steps[reached[-1]]
        # the trial as it was when it reached this rung: the pruner records the rung again
        trial.intermediate_values = {s: v for s, v in values.items() if s <= step}
        before_rung = functools.partial(_before_rung, rung=rung)
        trial.system_attrs = {k: v for k, v in attrs.items() if before_rung(k)}
        value = at_rung[rung][setting.key]
        if study.pruner.prune(_WithoutOwnRecords(study, trial._trial_id, before_rung), trial):
            kept = margin.spare(setting.key, step, value, at_rung[rung]) if margin is not None else None
            if kept is None:
                prunes.append(_prune(setting, rung, step, value, at_rung, spec))
            elif spared is not None:
                spared.append(kept)
    return prunes


class _WithoutOwnRecords:
    """The study as a pruner reads it while it judges one setting: that setting's own records that
    `keep` leaves out (those of the rung it is judged at, and after) are out of every reading of
    the trials, its bracket's included (Hyperband reads the storage through a study of its own).
    Successive halving adds the value it judges to the values recorded at the rung, where the
    setting's own record, made when it was told, would count it twice (six of five kept two, not
    one)."""

    def __init__(self, study: Any, trial_id: int, keep: Callable[[str], bool]) -> None:
        self._study = study
        self._storage = _StorageWithoutOwnRecords(study._storage, trial_id, keep)

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[Any]:
        return self._get_trials(deepcopy, states)

    def _get_trials(self, deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list[Any]:
        return self._storage.get_all_trials(self._study._study_id, deepcopy=deepcopy, states=states)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)


class _StorageWithoutOwnRecords:
    """Optuna's storage, reading one trial without the system attributes `keep` leaves out."""

    def __init__(self, storage: Any, trial_id: int, keep: Callable[[str], bool]) -> None:
        self._storage, self._trial_id, self._keep = storage, trial_id, keep

    def get_all_trials(self, study_id: int, deepcopy: bool = True, states: Any = None) -> list[Any]:
        trials = self._storage.get_all_trials(study_id, deepcopy=deepcopy, states=states)
        return [self._without_own(t) if t._trial_id == self._trial_id else t for t in trials]

    def _without_own(self, trial: Any) -> Any:
        kept = copy.copy(trial)
        kept.system_attrs = {k: v for k, v in trial.system_attrs.items() if self._keep(k)}
        return kept

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)


def _before_rung(attr: str, rung: int) -> bool:
    return _rung_of(attr) < rung


def _rung_of(attr: str) -> int:
    """The rung of a successive-halving record (`completed_rung_2` -> 2); -1 for anything else."""
    prefix = "completed_rung_"
    return (
        int(attr[len(prefix) :])
        if attr.startswith(prefix) and attr[len(prefix) :].isdigit()
        else -1
    )


def _judge_rung(
    study: Any,
    trials: Mapping[str, Any],
    spec: EarlyStop,
    batch: Sequence[tuple[int, int, SettingRuns, float]],
    at_rung: dict[int, dict[str, float]],
    judgement: Judgement,
    margin: Margin | None = None,
) -> list[Prune]:
    """The settings of `batch` (all reaching one rung in this check) told, then judged by the
    pruner against every setting at that rung, the whole batch included: settings that arrive
    together are compared with one another, none promoted for merely being told first."""
    before: dict[str, set[str]] = {}
    for rung, step, setting, value in batch:
        trial = trials[setting.key]
        before[setting.key] = set(study.get_trials(deepcopy=False)[trial.number].system_attrs)
        trial.report(value, step)
        trial.should_prune()  # records the setting's value at the rung (the pruner's own record)
        judgement.told.append(RungValue(setting.key, rung, float(step), value))
        at_rung.setdefault(rung, {})[setting.key] = value
    prunes: list[Prune] = []
    everyone = study.get_trials(deepcopy=True)
    for rung, step, setting, value in batch:
        frozen = everyone[trials[setting.key].number]
        # as it was before this batch: the pruner records its rung again and compares it with all
        told_before = before[setting.key].__contains__
        frozen.system_attrs = {k: v for k, v in frozen.system_attrs.items() if told_before(k)}
        if study.pruner.prune(_WithoutOwnRecords(study, frozen._trial_id, told_before), frozen):
            kept = margin.spare(setting.key, step, value, at_rung[rung]) if margin is not None else None
            if kept is None:
                prunes.append(_prune(setting, rung, step, value, at_rung, spec))
            else:
                judgement.spared.append(kept)
    return prunes


def _prune(
    setting: SettingRuns,
    rung: int,
    step: int,
    value: float,
    at_rung: Mapping[int, Mapping[str, float]],
    spec: EarlyStop,
) -> Prune:
    """The stop of `setting` at `rung`, ranked among every setting told at that rung."""
    others = [v for key, v in at_rung[rung].items() if key != setting.key]
    return Prune(
        setting.key,
        tuple(setting.live_job_ids()),
        rung,
        step,
        value,
        _rank(value, others, spec.mode),
        len(others) + 1,
    )


def final_value(setting: SettingRuns) -> float | None:
    """The mean of the last value each counted seed reported."""
    lasts = [seed.values[max(seed.values)] for seed in setting.counted() if seed.values]
    if (
        not lasts
        or len(lasts) != len(setting.counted())
        or not all(math.isfinite(v) for v in lasts)
    ):
        return None
    return sum(lasts) / len(lasts)
