"""The simulated worker's curves: a loss line per config and seed, and the validation curve that
early stopping and search judge in tests and demos. Pure, standard library only."""

from __future__ import annotations

import math
import zlib
from typing import Any


def _unit(text: str) -> float:
    """A number in [0, 1) fixed by `text` (crc32: the same on every run and machine)."""
    return zlib.crc32(text.encode("utf-8")) / 2**32


def sim_loss(step: int, config: dict[str, Any], seed: int) -> float:
    """The loss a step reports: falling from about 2 towards a floor, at a pace and to a floor
    set by the config (model, memory, learning rate, data) and a little by the seed, so the
    curves of different configs and seeds are different lines. Keys a ladder rung changes
    (batch, checkpointing) are left out: an exact retry reports the same curve."""
    setting = ":".join(
        str(config.get(k)) for k in ("model", "sim_mem_gib", "learning_rate", "data")
    )
    floor = 0.2 + 0.6 * _unit(setting)
    pace = 0.05 + 0.25 * _unit(setting + ":pace") + 0.02 * _unit(f"{setting}:{seed}")
    return round(floor + (2.0 - floor) / (1 + pace * step), 4)


def val_curve(config: dict[str, Any], step: int) -> dict[str, float]:
    """`val_accuracy` and `val_loss` at `step` when the config has `sim_best_lr` (else nothing):
    the accuracy climbs towards 0.9 - 0.15 x |log10(learning_rate / sim_best_lr)|, the loss falls
    as it climbs (0.3 + 2 x (1 - accuracy)), each a little apart per seed: early stopping's rules
    on either metric can be rehearsed on simulated cards."""
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
    accuracy = final * step / (step + 5)
    return {"val_accuracy": round(accuracy + 0.002 * (seed % 3), 4),
            "val_loss": round(0.3 + 2.0 * (1 - accuracy) + 0.003 * ((seed * 5) % 3), 4)}


def final_val(config: dict[str, Any], steps: int, otherwise: float) -> dict[str, float]:
    """result.json's val metrics: the curve's last values when there is one (else `otherwise`)."""
    curve = val_curve(config, steps)
    if not curve:
        return {"accuracy": otherwise}
    return {"accuracy": curve["val_accuracy"], "loss": curve["val_loss"]}


def final_test(config: dict[str, Any], steps: int, otherwise: float) -> dict[str, float]:
    """result.json's test metrics: with a val curve, its last value a little lower and apart per
    seed (a test split follows the setting as val does), else `otherwise`. Without it every
    setting's test accuracy was alike, and a table's test column said nothing of the search."""
    last = val_curve(config, steps).get("val_accuracy")
    if last is None:
        return {"accuracy": otherwise}
    seed = int(config.get("seed", 0) or 0)
    return {"accuracy": round(last - 0.01 + 0.003 * ((seed * 7) % 3 - 1), 4)}
