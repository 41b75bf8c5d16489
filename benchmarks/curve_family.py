"""The early-stopping benchmark's invented curves (benchmarks/early_stop_sim.py `--curves
parametric`), and what a source of curves gives the benchmark (`Drawn`, `Curves`).

A setting (learning rate × LoRA rank) ends at
    final = 0.88 - 0.05 * log10(lr / 2e-4)^2 + 0.004 * log2(r / 4) - 0.001 * log2(r / 4)^2
and climbs there from 0.5 as 0.5 + (final - 0.5) * (1 - exp(-(t / tau)^0.7)), tau = 300 steps *
(2e-4 / lr)^0.3 (a larger rate is ahead early and ends lower: the curves cross). Each seed's final
moves by N(0, 0.004), each evaluation (every 50 steps) by N(0, 0.003). A run is 2000 steps; the
grid is 11 learning rates (1e-5 to 1e-3) × 4 ranks × 3 seeds."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Protocol

from orchestrator.plans.early_stop import Mode

STEPS = 2000
EVAL_EVERY = 50
SEEDS_PER_SETTING = 3
LEARNING_RATES = [1e-5 * (100 ** (i / 10)) for i in range(11)]
RANKS = [4, 8, 16, 32]
BEST_LR = 2e-4
SEED_SD = 0.004  # a seed's final moves by N(0, SEED_SD)
EVAL_SD = 0.003  # each evaluation by N(0, EVAL_SD)
NOISE = [EVAL_SD]  # each evaluation's noise as run (--eval-sd)
CROSSING = [
    0.3
]  # tau's exponent: 0, curves never cross; larger, a large rate leads longer (--crossing)
NONE_KEPT = "none"


@dataclass
class Drawn:
    """One seed of a setting as the benchmark runs it: its value at each evaluation."""

    setting: str  # `lr=0.000251 r=16`
    final: float  # the seed's final without evaluation noise (recorded: its last evaluation)
    curve: list[float]  # at eval_every, 2 × eval_every, ..., steps


class Curves(Protocol):
    """A source of learning curves for the benchmark."""

    name: str
    steps: int  # a run's length: one GPU-hour
    eval_every: int
    metric: str  # as early_stop.metric names it: `val_accuracy`, `val_loss`
    mode: Mode  # of the metric; curves hold values times sign(mode): higher is better

    def draw(self, rng: random.Random, shuffled: bool) -> list[Drawn]:
        """Every run of the grid, queued setting by setting (the settings shuffled or not)."""
        ...

    def true_final(self, setting: str) -> float:
        """A setting's final without the noise of its drawn seeds; 0 for none kept."""
        ...

    def mean_se(self) -> float:
        """One standard error of a setting's measured final (the mean of 3 seeds' last evaluations)."""
        ...


def sign(mode: Mode) -> float:
    """What a value is multiplied by so that higher is better (a loss: -1)."""
    return 1.0 if mode is Mode.MAX else -1.0


def setting_name(lr: float, rank: int) -> str:
    return f"lr={lr:.3g} r={rank}"


def final_of(lr: float, rank: int, warmup: float = 0.05) -> float:
    r = math.log2(rank / 4)
    return (
        0.88
        - 0.05 * math.log10(lr / BEST_LR) ** 2
        + 0.004 * r
        - 0.001 * r * r
        - 0.2 * (warmup - 0.05) ** 2
    )


def value_at(final: float, lr: float, step: int) -> float:
    tau = 300 * (BEST_LR / lr) ** CROSSING[0]
    return 0.5 + (final - 0.5) * (1 - math.exp(-((step / tau) ** 0.7)))


def mean_se() -> float:
    """One standard error of a setting's measured final (the mean of its seeds' last
    evaluations): two settings whose true finals are closer than this, the full grid itself
    orders by chance nearly as often as not (it picks the truly better one with probability at
    most 0.76, Phi(1/sqrt 2))."""
    return math.sqrt(SEED_SD**2 + NOISE[0] ** 2) / math.sqrt(SEEDS_PER_SETTING)


def true_final(setting: str) -> float:
    """A setting's final without noise, from its name (`lr=0.000251 r=16`); 0 for none kept."""
    if setting == NONE_KEPT:
        return 0.0
    lr, rank = (part.split("=")[1] for part in setting.split())
    return final_of(float(lr), int(rank))


def true_best() -> str:
    settings = [setting_name(lr, rank) for lr in LEARNING_RATES for rank in RANKS]
    return max(settings, key=true_final)


class Parametric:
    """The invented family above (`--crossing`, `--eval-sd` set CROSSING and NOISE)."""

    name = "parametric"
    steps = STEPS
    eval_every = EVAL_EVERY
    metric = "val_accuracy"
    mode = Mode.MAX

    def draw(self, rng: random.Random, shuffled: bool) -> list[Drawn]:
        settings = [(lr, rank) for lr in LEARNING_RATES for rank in RANKS]
        if shuffled:
            random.Random(rng.random()).shuffle(settings)
        drawn: list[Drawn] = []
        for lr, rank in settings:
            for _ in range(SEEDS_PER_SETTING):
                final = final_of(lr, rank) + rng.gauss(0, SEED_SD)
                noise = [rng.gauss(0, NOISE[0]) for _ in range(STEPS // EVAL_EVERY)]
                curve = [value_at(final, lr, (k + 1) * EVAL_EVERY) + n for k, n in enumerate(noise)]
                drawn.append(Drawn(setting_name(lr, rank), final, curve))
        return drawn

    def true_final(self, setting: str) -> float:
        return true_final(setting)

    def mean_se(self) -> float:
        return mean_se()
