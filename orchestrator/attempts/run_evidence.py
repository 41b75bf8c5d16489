"""What results must know of an ended attempt beside its scores: whether its loss diverged (the
rule of attempts.divergence, on our worker's loss summary or on the losses a script printed)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.attempts.divergence import (
    DEFAULT_FACTOR,
    LossSummary,
    summary_from_record,
    verdict,
)
from orchestrator.attempts.stdout_follow import printed_loss_summary
from orchestrator.store.rows import Job


@dataclass(frozen=True)
class LossVerdict:
    summary: LossSummary | None  # None: the run reported no loss and printed none
    diverged: str | None  # why the rule flagged it; None: not flagged
    fail: bool  # the suite's `fail_on_divergence`: a flagged run fails instead of succeeding


def divergence_factor(job: Job) -> float | None:
    """The suite's k (stored with the job); None when the minimum rule is off."""
    stored = job.worker_output.get("divergence_factor")
    if stored is None:
        return DEFAULT_FACTOR
    return float(stored) if isinstance(stored, int | float) and not isinstance(stored, bool) and stored >= 1 else None


def loss_verdict(job: Job, run_dir: Path, result: dict[str, Any] | None) -> LossVerdict:
    """The run's loss summary (result.json's `loss_summary`, else what it printed) and the rule's word."""
    summary = summary_from_record((result or {}).get("loss_summary"))
    if summary is None:
        regex = job.worker_output.get("progress_regex")
        try:
            summary = printed_loss_summary(run_dir, regex if isinstance(regex, str) else None)
        except re.error:  # checked at submit; a row edited since must not stop the attempt's end
            summary = None
    reason = verdict(summary, divergence_factor(job)) if summary is not None else None
    return LossVerdict(summary, reason, job.worker_output.get("fail_on_divergence") is True)
