"""How the recorded learning curves (benchmarks/results/lr_grid_curves.json) compare with the
early-stopping benchmark's invented family (benchmarks/curve_family.py): the family fitted to them,
and how well each step's values rank the settings by their finals.

    python -m benchmarks.recorded_fit [--recording PATH]

The fit: each setting's mean curve over its recorded seeds against
    final = a - b * log10(lr / lr_best)^2 + c * log2(r / 4) - d * log2(r / 4)^2
    value(t) = v0 + (final - v0) * (1 - exp(-(t / tau)^p)),  tau = tau0 * (lr_best / lr)^crossing
(the family's form, with its start v0, time constant, shape and crossing exponent free; scipy's
least squares). Printed: the parameters, the residual (root mean square over every setting's
evaluations, and over the finals alone), and per step the Spearman correlation of the settings'
mean values with their finals and where the best final setting ranks: the curves cross where an
early rank disagrees with the final one."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from statistics import mean

from benchmarks.recorded_curves import RECORDED, Recorded, load

NAMES = ("a", "b", "log10_lr_best", "c", "d", "v0", "tau0", "p", "crossing")


def mean_curves(recorded: Recorded) -> dict[str, list[float]]:
    return {
        s: [mean(values) for values in zip(*seeds, strict=True)]
        for s, seeds in recorded.curves.items()
    }


def family(params: list[float], lr: float, rank: int, step: float) -> float:
    a, b, log_best, c, d, v0, tau0, p, crossing = params
    r = math.log2(rank / 4)
    final = a - b * (math.log10(lr) - log_best) ** 2 + c * r - d * r * r
    tau = tau0 * (10**log_best / lr) ** crossing
    return v0 + (final - v0) * (1 - math.exp(-((step / tau) ** p)))


def fit(recorded: Recorded) -> tuple[list[float], float, float]:
    """The fitted parameters, and the residual's root mean square over every point and over the finals."""
    from scipy.optimize import least_squares

    curves = mean_curves(recorded)
    settings = [(lr, r) for lr in recorded.learning_rates for r in recorded.ranks]
    steps = [(k + 1) * recorded.eval_every for k in range(recorded.steps // recorded.eval_every)]

    def residuals(params: list[float]) -> list[float]:
        return [
            family(list(params), lr, r, step) - value
            for lr, r in settings
            for step, value in zip(steps, curves[_name(lr, r)], strict=True)
        ]

    start = [0.8, 0.1, math.log10(3e-3), 0.0, 0.0, 0.56, 100.0, 1.0, 0.5]
    low = [0.5, 0.0, -5.0, -0.2, -0.2, 0.3, 1.0, 0.2, -2.0]
    high = [1.0, 2.0, -1.0, 0.2, 0.2, 0.7, 5000.0, 5.0, 3.0]
    found = least_squares(residuals, start, bounds=(low, high))
    params = [float(x) for x in found.x]
    every = residuals(params)
    finals = [
        family(params, lr, r, recorded.steps) - curves[_name(lr, r)][-1] for lr, r in settings
    ]
    return params, _rms(every), _rms(finals)


def rank_agreement(recorded: Recorded, step: int) -> tuple[float, int]:
    """Spearman's correlation of the settings' mean values at `step` with their finals, and the
    rank at `step` of the setting with the best final."""
    curves = mean_curves(recorded)
    index = step // recorded.eval_every - 1
    settings = list(curves)
    early = _ranks([curves[s][index] for s in settings])
    final = _ranks([curves[s][-1] for s in settings])
    n = len(settings)
    rho = 1 - 6 * sum((x - y) ** 2 for x, y in zip(early, final, strict=True)) / (n * (n * n - 1))
    best = max(settings, key=lambda s: curves[s][-1])
    return rho, int(early[settings.index(best)])


def _ranks(values: list[float]) -> list[float]:
    """1 for the largest; ties share their mean rank."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _name(lr: float, rank: int) -> str:
    from benchmarks.curve_family import setting_name

    return setting_name(lr, rank)


def _rms(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recorded_fit", description=__doc__)
    parser.add_argument("--recording", type=Path, default=RECORDED)
    args = parser.parse_args(argv)
    recorded = load(args.recording)
    params, rms_all, rms_finals = fit(recorded)
    print("fitted: " + ", ".join(f"{n} {v:.4g}" for n, v in zip(NAMES, params, strict=True)))
    print(f"  lr_best {10 ** params[2]:.3g}; residual rms {rms_all:.4f} over every evaluation, {rms_finals:.4f} "
          f"over the finals")  # fmt: skip
    print(
        f"seed sd of a final within a setting (pooled over the top quarter of the settings): {recorded.seed_sd():.4f}"
    )
    first = recorded.steps // 10  # the benchmark's default min_steps; its rungs at factors 2 and 3
    for step in sorted({first * 2**k for k in range(4)} | {first * 3**k for k in range(3)}):
        if step <= recorded.steps and step % recorded.eval_every == 0:
            rho, rank = rank_agreement(recorded, step)
            print(f"step {step}: Spearman {rho:.3f} with the finals; the best final setting ranks {rank} of "
                  f"{len(recorded.curves)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
