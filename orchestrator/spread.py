"""The spread of metric values (pure): a sample standard deviation, and values for a t test, that
stay within a float's range for every value a metric may hold (up to wording.MAX_METRIC, 1e300),
whose deviations' squares would not."""

from __future__ import annotations

import math
from collections.abc import Sequence

# n numbers each at most this big, over the square root of n, square and sum within a float's
# range; bigger ones are scaled first, so values of a common size give the same bits as the plain
# sum of squares
SQUARE_SAFE = 1e150


def _square_safe(size: float, n: int) -> bool:
    return size <= SQUARE_SAFE / math.sqrt(n)


def sample_std(values: Sequence[float]) -> float:
    """The sample standard deviation (n - 1 in the denominator) of two or more values about
    their mean: the deviations' squares summed scaled by the largest deviation where they would
    leave a float's range."""
    if len(values) < 2:
        raise ValueError("a sample standard deviation needs two values")
    mean = sum(values) / len(values)
    deviations = [v - mean for v in values]
    scale = max(abs(d) for d in deviations)
    if _square_safe(scale, len(values)):
        return math.sqrt(sum(d**2 for d in deviations) / (len(values) - 1))
    return scale * math.sqrt(sum((d / scale) ** 2 for d in deviations) / (len(values) - 1))


def in_square_range(values: Sequence[float]) -> list[float]:
    """Values scaled (all by one power of two) so that their deviations' squares sum within a
    float's range: for a statistic a common scale leaves as it is (a t statistic). Values of a
    common size are returned as they are."""
    size = max((abs(v) for v in values), default=0.0)
    if _square_safe(2 * size, max(1, len(values))):  # a deviation from the mean is at most 2 * size
        return list(values)
    factor = 2.0 ** -math.frexp(size)[1]
    return [v * factor for v in values]
