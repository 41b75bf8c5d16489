"""A job's headline metric, for the job lists (`orch jobs`, /jobs, `Sweep.jobs()`). Pure.

The last values an attempt reported are many (loss, learning rate, eval metrics, the final
test metrics); a list has room for one. The choice, in order: a test metric, an eval or
validation metric that is not a loss, an eval or validation loss, the training loss."""

from __future__ import annotations

from collections.abc import Mapping

_QUALITY_PREFIXES = ("test_", "eval_", "val_")


def headline_metric(values: Mapping[str, float]) -> tuple[str, float] | None:
    """(key, value) of the metric a list shows for a job; None when it reported none."""
    ranked = sorted(values, key=lambda key: (_rank(key), key))
    if not ranked or _rank(ranked[0]) > 3:
        return None
    return ranked[0], values[ranked[0]]


def _rank(key: str) -> int:
    if key.startswith("test_"):
        return 0 if not key.endswith("loss") else 1
    if key.startswith(_QUALITY_PREFIXES):
        return 1 if not key.endswith("loss") else 2
    return 3 if key == "loss" else 4


def shown_metric(values: Mapping[str, float]) -> str:
    """`eval_accuracy=0.8125` (4 significant digits; one word, for piped columns), or `-`."""
    headline = headline_metric(values)
    return "-" if headline is None else f"{headline[0]}={headline[1]:.4g}"
