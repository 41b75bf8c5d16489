"""The simulated worker's loss curve: a different line per config and seed. Pure, standard
library only."""

from __future__ import annotations

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
