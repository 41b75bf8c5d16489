"""The one metric a job list shows for a job (`orch jobs`, the web page's jobs, `Sweep.jobs()`),
by the rule `orch results` picks a row's metric with, so a list and the results table agree. Pure.

The last values an attempt reported are many (loss, learning rate, eval metrics, the final
test metrics); a list has room for one. In order: the task's primary metric (`f1` for MRPC,
else accuracy: `primary_metric`), read as results read it (`X`, `test_X`, `eval_X`); then
accuracy; then, for a script that reports neither, a test metric, an eval or validation metric
that is not a loss, an eval or validation loss, the training loss."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.results.aggregate import DEFAULT_METRIC, primary_metric

_QUALITY_PREFIXES = ("test_", "eval_", "val_")
_ALIASES = ("", "test_", "eval_")  # how results read a metric X (results.collect.job_metrics)


def headline_metric(values: Mapping[str, float], task: str = "") -> tuple[str, float] | None:
    """(key, value) of the metric a list shows for a job of `task`; None when it reported none."""
    for metric in dict.fromkeys((primary_metric(task), DEFAULT_METRIC)):
        for prefix in _ALIASES:
            if prefix + metric in values:
                return prefix + metric, values[prefix + metric]
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
