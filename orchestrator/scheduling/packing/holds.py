"""Cards kept for one waiting job, so that backfill cannot starve it. Pure.

A head job that has waited `starvation_s` keeps its best card, and the first multi-GPU job keeps
the N cards that will be ready soonest. Either way a kept card still takes jobs expected to end
before the kept-for job is expected to fit there (EASY backfilling), or jobs that fit beside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from orchestrator.scheduling.packing.cards import Card, blocker, headroom_beside_mib, need_mib
from orchestrator.scheduling.packing.fit_time import card_fits_at_s
from orchestrator.scheduling.packing.gang import HostState, closest_set, ready_at_s
from orchestrator.scheduling.packing.types import QueuedJob
from orchestrator.scheduling.waits import Blocker, gang_note

_NEVER = (Blocker.PLAN, Blocker.NEVER)


def next_end_frees(job: QueuedJob, cards: list[Card]) -> bool:
    """Whether on some card, whichever running attempt ends next frees enough for `job`. Then the
    job cannot starve: it comes first in order at that end, so holding a card for it would only
    idle the card. On a card at its plan cap nothing can start before that end, so the memory
    free now counts too; on one with a free slot, backfill may take it first."""
    if job.run_alone or job.gpus > 1:
        return False
    for c in cards:
        if not c.frees or c.alone or blocker(job, c) in _NEVER:
            continue
        kept = max(0, c.available_mib) if c.used_slots >= c.gpu.slots else 0
        if min(frees_mib for _, frees_mib in c.frees) + kept >= need_mib(job, c):
            return True
    return False


def best_candidate(job: QueuedJob, cards: list[Card]) -> Card | None:
    """The card where a starving job should fit soonest: fewest jobs to drain, then smallest
    memory deficit now."""
    possible = [c for c in cards if blocker(job, c) not in _NEVER]
    if not possible:
        return None

    def deficit(c: Card) -> tuple[int, int, int]:
        jobs_to_drain = (
            c.used_slots if job.run_alone or c.alone else max(0, c.used_slots - c.gpu.slots + 1)
        )
        return (jobs_to_drain, max(0, need_mib(job, c) - c.available_mib), c.gpu.index)

    return min(possible, key=deficit)


def hold_for_starving(job: QueuedJob, allowed: list[Card], now_s: float) -> Card | None:
    """Keep the starving head job's best card from when it is expected to fit there; until then
    only jobs that end before, or fit beside it, start there. None when no hold is needed (one
    running attempt's end will make room for it anyway) or no card can ever take it."""
    if next_end_frees(job, allowed):
        return None
    best = best_candidate(job, [c for c in allowed if c.held_for is None])
    if best is not None:
        best.held_for = job.job_id
        # an end in the way unknown, or never: no time before which backfill surely ends
        fit_s = card_fits_at_s(job, best, now_s)
        best.held_until_s = math.inf if fit_s is None else fit_s
        best.held_need_mib = need_mib(job, best)
    return best


def reserve_for_gang(
    ordered: list[QueuedJob], cards: dict[int, Card], now_s: float,
    topology: Mapping[tuple[int, int], int] | None, host: HostState | None,
) -> dict[int, str]:
    """Keep cards for the first multi-GPU job in order that could ever run: the N allowed cards
    that are ready soonest (closest among equals). Jobs before it in order may use them only as
    backfill, so a stream of one-GPU jobs cannot keep the gang from ever finding N free cards.
    Returns {job id: what was reserved} for its wait reason."""
    for job in ordered:
        if job.gpus <= 1:
            continue
        allowed = [c for i, c in sorted(cards.items())
                   if (job.allowed_gpu_indices is None or i in job.allowed_gpu_indices) and c.held_for is None]
        possible = [c for c in allowed if blocker(job, c, now_s) not in _NEVER]
        if len(possible) < job.gpus:
            continue  # can never run: its reason says so; it must not hold cards
        if host is not None and job.host_mib > host.total_mib:
            continue
        ready = {c.gpu.index: (now_s if blocker(job, c, now_s) is None else ready_at_s(now_s, c.ends_s))
                 for c in possible}
        cutoff = sorted(ready.values())[job.gpus - 1]
        pool = [c for c in possible if ready[c.gpu.index] <= cutoff]
        chosen = closest_set(
            pool,
            job.gpus,
            index_of,
            topology,
            lambda c, ready=ready: (ready[c.gpu.index], c.used_slots, c.gpu.index),  # type: ignore[misc]
        )
        until_s = max(ready[c.gpu.index] for c in chosen)
        for card in chosen:
            card.held_for, card.held_gang = job.job_id, True
            card.held_until_s = until_s
            card.held_need_mib = job.predicted_peak_mib + headroom_beside_mib(job, card)
        free_now = [c.gpu.index for c in chosen if ready[c.gpu.index] <= now_s]
        waiting = [c.gpu.index for c in chosen if ready[c.gpu.index] > now_s]
        return {job.job_id: gang_note(free_now + waiting, waiting, until_s - now_s)}
    return {}


def index_of(card: Card) -> int:
    return card.gpu.index
