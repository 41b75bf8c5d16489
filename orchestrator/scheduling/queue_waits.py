"""How long each queued job has waited, for the starvation hold: measured on the daemon's
monotonic clock from when this daemon first saw the job queued.

Wall time is not a measure of it: a +1 h step (NTP, `date -s`, a VM resume) would make every
queued job count as starving, so cards are held for all of them, and a step back would make
none starve for as long as the step. A job that was already queued when this daemon first saw
it (queued while no daemon ran, or deep in a queue the daemon had not read yet) also counts the
time before, from its stored `queued_at` and the wall clock at that first sight: a step since
then moves neither. A negative gap (the clock went back in between) or an absurd one counts as
nothing: the job then starves one `starvation_s` later than it should, at most.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from dataclasses import dataclass, field

from orchestrator.executors.launch_age import MAX_TRUSTED_GAP_S
from orchestrator.store.rows import QueueEntry

# The longest wait before the daemon's first sight taken from wall times: the gap the launch
# grace trusts. Longer reads as a clock step forward as much as a long stop; either way the job
# waits a little longer, never less.
MAX_TRUSTED_WAIT_BEFORE_S = MAX_TRUSTED_GAP_S


def waited_before_s(now_s: float, queued_at_s: float) -> float:
    """The wait before the daemon first saw a job, from two wall times read then; 0 where the
    gap is negative, absurd or not a number."""
    gap_s = now_s - queued_at_s
    if not math.isfinite(gap_s) or gap_s < 0 or gap_s > MAX_TRUSTED_WAIT_BEFORE_S:
        return 0.0
    return gap_s


@dataclass
class QueueWaits:
    """Per queued job: the `queued_at` it was seen with, and the monotonic reading its wait counts
    from. A job that re-entered the queue (a retry, a requeue) has a new `queued_at`: its wait
    starts again."""

    since: dict[int, tuple[float, float]] = field(default_factory=dict)

    def saw(self, entry: QueueEntry, now_s: float, monotonic_s: float) -> None:
        known = self.since.get(entry.id)
        if known is None or known[0] != entry.queued_at:
            self.since[entry.id] = (entry.queued_at, monotonic_s - waited_before_s(now_s, entry.queued_at))

    def waited_s(self, entry: QueueEntry, now_s: float, monotonic_s: float) -> float:
        """How long the job has waited (it is first seen now if it was not before)."""
        self.saw(entry, now_s, monotonic_s)
        return max(0.0, monotonic_s - self.since[entry.id][1])

    def waiting_since_s(self, rows: Iterable[QueueEntry], now_s: float, monotonic_s: float) -> dict[int, float]:
        """Job id -> when its wait began on the scale of `now_s` (what `pack` compares with
        `now_s`): `now_s` less the wait measured here, so a wall step moves both alike."""
        return {row.id: now_s - self.waited_s(row, now_s, monotonic_s) for row in rows}

    def forget(self, job_ids: Iterable[int]) -> None:
        for job_id in job_ids:
            self.since.pop(job_id, None)

    def keep_only(self, queued: Container[int]) -> None:
        self.since = {k: v for k, v in self.since.items() if k in queued}
