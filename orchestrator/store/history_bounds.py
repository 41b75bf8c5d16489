"""What keeps an attempt's metric history bounded (pure): at most MAX_KEYS keys, and a key
past MAX_POINTS_PER_KEY points thinned so that its spikes and dips survive."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

MAX_POINTS_PER_KEY = 2000  # beyond this a key's history is downsampled to half (min and max kept)
MAX_KEYS = 48


@dataclass(frozen=True, slots=True)
class Point:
    step: float
    key: str
    value: float


def keep_keys(points: Iterable[Point], known: set[str], max_keys: int = MAX_KEYS) -> list[Point]:
    """Points whose key is known or fits under `max_keys` (new keys are added to `known`)."""
    kept = []
    for point in points:
        if point.key not in known:
            if len(known) >= max_keys:
                continue
            known.add(point.key)
        kept.append(point)
    return kept


def downsample(points: list[tuple[float, float]], target: int) -> list[tuple[float, float]]:
    """At most about `target` of (step, value) points sorted by step: the first and the last, and
    in each of target/2 buckets of consecutive points its minimum and its maximum, so a spike
    or a dip survives the thinning."""
    if len(points) <= target or target < 4:
        return points
    buckets = max(1, (target - 2) // 2)
    inner = points[1:-1]
    size = math.ceil(len(inner) / buckets)
    kept: list[tuple[float, float]] = [points[0]]
    for start in range(0, len(inner), size):
        bucket = inner[start:start + size]
        low = min(range(len(bucket)), key=lambda i: bucket[i][1])
        high = max(range(len(bucket)), key=lambda i: bucket[i][1])
        kept += [bucket[i] for i in sorted({low, high})]
    kept.append(points[-1])
    return kept
