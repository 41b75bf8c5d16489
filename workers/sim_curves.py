"""The sim worker's validation curve: what early stopping and search judge in tests and demos."""

from __future__ import annotations

import math
from typing import Any


def val_curve(config: dict[str, Any], step: int) -> dict[str, float]:
    """`val_accuracy` at `step` when the config has `sim_best_lr` (else nothing): it climbs
    towards 0.9 - 0.15 x |log10(learning_rate / sim_best_lr)|, a little apart per seed."""
    best_lr = config.get("sim_best_lr")
    lr = config.get("learning_rate")
    if (
        not isinstance(best_lr, (int, float))
        or not isinstance(lr, (int, float))
        or best_lr <= 0
        or lr <= 0
    ):
        return {}
    final = 0.9 - 0.15 * abs(math.log10(lr / best_lr))
    seed = int(config.get("seed", 0) or 0)
    return {"val_accuracy": round(final * step / (step + 5) + 0.002 * (seed % 3), 4)}


def final_val(config: dict[str, Any], steps: int, otherwise: float) -> dict[str, float]:
    """result.json's val metrics: the curve's last value when there is one (else `otherwise`)."""
    return {"accuracy": val_curve(config, steps).get("val_accuracy", otherwise)}
