"""A job's headline metric as the job lists word it (`orch jobs`, /jobs, `Sweep.jobs()`): the
rule is results' own (orchestrator.results.headline), so a list and `orch results` agree. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.results.headline import headline_metric

__all__ = ["earlier_attempt", "headline_metric", "shown_metric"]


def shown_metric(values: Mapping[str, float], task: str = "") -> str:
    """`eval_accuracy=0.8125` (4 significant digits; one word, for piped columns), or `-`."""
    headline = headline_metric(values, task)
    return "-" if headline is None else f"{headline[0]}={headline[1]:.4g}"


def earlier_attempt(reported_by: int | None, latest: int | None) -> int | None:
    """The attempt whose values a list shows, where it is not the job's latest (a retry that has
    reported nothing yet shows its predecessor's: said beside the value); None otherwise."""
    return reported_by if reported_by is not None and latest is not None and reported_by != latest else None
