"""A job's headline metric as the job lists word it (`orch jobs`, /jobs, `Sweep.jobs()`): the
rule is results' own (orchestrator.results.headline), so a list and `orch results` agree. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.results.headline import headline_metric

__all__ = ["headline_metric", "shown_metric"]


def shown_metric(values: Mapping[str, float], task: str = "") -> str:
    """`eval_accuracy=0.8125` (4 significant digits; one word, for piped columns), or `-`."""
    headline = headline_metric(values, task)
    return "-" if headline is None else f"{headline[0]}={headline[1]:.4g}"
