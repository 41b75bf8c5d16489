"""What results must know of an ended attempt beside its scores: whether its loss diverged (the
rule of attempts.divergence, on our worker's loss summary, on the attempt's reported history of
`loss` and on the losses a script printed)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.attempts.divergence import (
    DEFAULT_FACTOR,
    LossSummary,
    summarise_losses,
    summary_from_record,
    verdict,
)
from orchestrator.attempts.history_follow import reported_loss_summary
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


def loss_verdict(job: Job, run_dir: Path, result: dict[str, Any] | None,
                 history_losses: Sequence[float] = ()) -> LossVerdict:
    """The rule's word on every loss record the run left: result.json's `loss_summary` (our
    LoRA worker's, over every step), its reported history of `loss` (progress.jsonl or printed
    log dicts, as stored: any worker), progress.jsonl's losses with their NaNs (the history keeps
    finite values only) and the losses it printed. Flagged when any says diverged;
    the summary kept is the one that flagged, else the first known in that order."""
    factor = divergence_factor(job)
    summaries = [summary_from_record((result or {}).get("loss_summary"))]
    if history_losses:
        summaries.append(summarise_losses(history_losses))
    summaries.append(reported_loss_summary(run_dir))  # progress.jsonl again: its NaN losses too
    regex = job.worker_output.get("progress_regex")
    with contextlib.suppress(re.error):  # checked at submit; a row edited since must not stop the end
        summaries.append(printed_loss_summary(run_dir, regex if isinstance(regex, str) else None))
    known = [summary for summary in summaries if summary is not None]
    judged = [(summary, verdict(summary, factor)) for summary in known]
    flagged = next(((summary, reason) for summary, reason in judged if reason is not None), None)
    summary, reason = flagged or (known[0] if known else None, None)
    return LossVerdict(summary, reason, job.worker_output.get("fail_on_divergence") is True)
