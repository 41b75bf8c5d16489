"""The peak of an attempt whose job a warm LoRA worker process trains (`share_base`).

The attempt's own processes are a thin client holding no GPU memory: the job's memory is in the
warm process, which orch did not start for this attempt. Its worker reports the job's peak (the
allocator's, reset at the job's start) on every progress line; that figure counts as the
attempt's running peak, so a running job of a shape teaches its true peak, not the client's.
The line is untrusted input: anything but a number of MiB in range counts as nothing.
"""

from __future__ import annotations

from typing import Any

from orchestrator.prediction.fused_groups import fused, shares_base
from orchestrator.store.rows import Job

MAX_REPORTED_MIB = 16 * 1024 * 1024  # 16 TiB: above any card


def shared_base_peak_mib(job: Job, progress: dict[str, Any] | None) -> int:
    """The job's peak from its last progress line when a warm process trains it one job at a
    time, else 0. A fused member's line reports the peak of its whole group's process: not the
    job's own, so it teaches nothing of the job's shape while it runs (see
    orchestrator.attempts.fused_lessons for what its end teaches)."""
    if not shares_base(job) or fused(job) or not progress:
        return 0
    value = progress.get("peak_mem_mib")
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_REPORTED_MIB
    ):
        return 0
    return int(value)
