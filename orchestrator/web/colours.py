"""Colours a reader can tell apart: a job's colour says its config (one hue per config), its
seed a shade of that hue, so the jobs of a sweep never share a colour and the seeds of one
config read as one family. Reds and oranges are left to OOMs and foreign memory, greys to free
memory. Pure."""

from __future__ import annotations

from collections.abc import Mapping

GOLDEN_FRACTION = 0.6180339887  # successive hues spread evenly over the span, for any number of configs
HUE_FROM, HUE_SPAN = 60.0, 270.0  # yellow-green through blue to magenta: no reds or oranges
LIGHTEST, DARKEST = 68.0, 30.0  # lightness (%) of a config's first and last shade


def config_hue(i: int) -> float:
    """The i-th config's hue: each new one lands in the widest gap the earlier ones left."""
    return HUE_FROM + HUE_SPAN * ((i * GOLDEN_FRACTION) % 1.0)


def job_colours(config_of: Mapping[int, str]) -> dict[int, str]:
    """Job id -> an `hsl(...)` colour: the config's hue (configs in name order), and for each of
    its jobs (by id, as seeds are submitted) a shade from dark to light."""
    by_config: dict[str, list[int]] = {}
    for job_id in sorted(config_of):
        by_config.setdefault(config_of[job_id], []).append(job_id)
    colours: dict[int, str] = {}
    for i, config in enumerate(sorted(by_config)):
        jobs = by_config[config]
        hue = config_hue(i)
        for k, job_id in enumerate(jobs):
            lightness = (
                (DARKEST + LIGHTEST) / 2
                if len(jobs) == 1
                else DARKEST + (LIGHTEST - DARKEST) * k / (len(jobs) - 1)
            )
            colours[job_id] = f"hsl({hue:.0f}, 62%, {lightness:.0f}%)"
    return colours
