"""The early-stopping benchmark's recorded curves (benchmarks/early_stop_sim.py `--curves
recorded`, the default): the LoRA worker's validation histories that benchmarks/lr_grid_record.py
kept in benchmarks/results/lr_grid_curves.json, one per (learning rate, rank, seed).

Each benchmark seed draws, for every setting, 3 of its recorded seeds without replacement, and
queues the settings as the parametric family does (shuffled as orch shuffles an early_stop
suite). A run is as recorded (480 steps, an evaluation every 16): one GPU-hour. A setting's
"true" final is the mean of the last evaluations of all its recorded seeds; one standard error
of a 3-seed mean is the pooled spread of the finals within the top quarter of the settings over
sqrt(3).

`metric` picks the histories: `accuracy` (the recording's `val`) or `loss` (its `val_loss`,
`mode: min`). A loss is held negated, so that higher is better throughout the benchmark; the
decision core is told the loss itself, under `mode: min`."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from benchmarks.curve_family import NONE_KEPT, SEEDS_PER_SETTING, Drawn, setting_name, sign
from orchestrator.plans.early_stop import Mode

RECORDED = Path(__file__).resolve().parent / "results" / "lr_grid_curves.json"
# --metric: the run's history key, the metric as early_stop names it, its mode
METRICS = {"accuracy": ("val", "val_accuracy", Mode.MAX), "loss": ("val_loss", "val_loss", Mode.MIN)}


class RecordingError(ValueError):
    """A recording that does not hold a full grid of whole histories."""


@dataclass
class Recorded:
    """The recorded grid: per setting (grid order), each seed's value at every evaluation."""

    steps: int
    eval_every: int
    learning_rates: list[float]
    ranks: list[int]
    curves: dict[str, list[list[float]]]  # times sign(mode): higher is better
    name: str = "recorded"
    metric: str = "val_accuracy"
    mode: Mode = Mode.MAX

    def draw(self, rng: random.Random, shuffled: bool) -> list[Drawn]:
        settings = list(self.curves)
        if shuffled:
            random.Random(rng.random()).shuffle(settings)
        drawn: list[Drawn] = []
        for setting in settings:
            seeds = self.curves[setting]
            for index in rng.sample(range(len(seeds)), SEEDS_PER_SETTING):
                drawn.append(Drawn(setting, seeds[index][-1], list(seeds[index])))
        return drawn

    def true_final(self, setting: str) -> float:
        if setting == NONE_KEPT:  # as bad as accuracy 0, or as the worst setting's loss
            return 0.0 if self.mode is Mode.MAX else min(self.true_final(s) for s in self.curves)
        return mean(seed[-1] for seed in self.curves[setting])

    def seed_sd(self) -> float:
        """The pooled standard deviation of a seed's final within a setting, over the top quarter
        of the settings (those the grid's best is drawn from; a learning rate that fails in some
        seeds and not in others spreads its finals far wider, and would call settings tied that the
        full grid tells apart)."""
        ranked = sorted(self.curves, key=self.true_final, reverse=True)
        contenders = ranked[: max(1, len(ranked) // 4)]
        squares = [
            (seed[-1] - self.true_final(s)) ** 2 for s in contenders for seed in self.curves[s]
        ]
        freedom = sum(len(self.curves[s]) - 1 for s in contenders)
        return math.sqrt(sum(squares) / freedom)

    def mean_se(self) -> float:
        return self.seed_sd() / math.sqrt(SEEDS_PER_SETTING)

    def seeds(self) -> int:
        return min(len(seeds) for seeds in self.curves.values())


def load(path: Path = RECORDED, metric: str = "accuracy") -> Recorded:
    """The recording at `path`, checked: every setting of the grid with at least 3 seeds, each
    history of `metric` (`accuracy` or `loss`) evaluated at every `eval_every` steps up to `steps`."""
    try:
        return _parse(path, json.loads(path.read_text(encoding="utf-8")), metric)
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        if isinstance(exc, RecordingError):
            raise
        raise RecordingError(f"{path}: not a recording: {exc!r}"[:200]) from None


def _parse(path: Path, document: Any, metric: str) -> Recorded:
    if not isinstance(document, dict):
        raise RecordingError(f"{path}: not a JSON object")
    key, name, mode = METRICS[metric]
    steps, every = _int(document, "steps"), _int(document, "eval_every_steps")
    if steps % every:
        raise RecordingError(f"{path}: steps {steps} is not a multiple of eval_every_steps {every}")
    rates = [float(lr) for lr in document.get("learning_rates", [])]
    ranks = [int(r) for r in document.get("ranks", [])]
    expected = [(k + 1) * every for k in range(steps // every)]
    curves: dict[str, list[list[float]]] = {setting_name(lr, r): [] for lr in rates for r in ranks}
    for run in document.get("runs", []):
        setting = setting_name(float(run["lr"]), int(run["r"])) if isinstance(run, dict) else ""
        if setting not in curves:
            raise RecordingError(f"{path}: a run outside the grid: {str(run)[:80]}")
        points = run.get(key)
        if points is None:
            raise RecordingError(f"{path}: {setting} seed {run.get('seed')}: no {key} history "
                                 "(recorded before the worker reported it: record again)")  # fmt: skip
        if not isinstance(points, list) or [_step(p) for p in points] != expected:
            raise RecordingError(
                f"{path}: {setting} seed {run.get('seed')}: not evaluated every {every} steps"
            )
        curves[setting].append([sign(mode) * float(p[1]) for p in points])
    short = [s for s, seeds in curves.items() if len(seeds) < SEEDS_PER_SETTING]
    if not curves or short:
        raise RecordingError(
            f"{path}: fewer than {SEEDS_PER_SETTING} seeds of {', '.join(short) or 'any setting'}"
        )
    return Recorded(steps, every, rates, ranks, curves, metric=name, mode=mode)


def _int(document: dict[str, Any], key: str) -> int:
    value = document.get(key)
    if not isinstance(value, int) or value <= 0:
        raise RecordingError(f"{key} must be a positive integer, got {value!r}")
    return value


def _step(point: Any) -> int | None:
    ok = (
        isinstance(point, list)
        and len(point) == 2
        and all(isinstance(v, (int, float)) for v in point)
    )
    return int(point[0]) if ok and math.isfinite(point[1]) else None
