"""When a queued job is expected to fit on one card: the one answer the starvation hold
(holds.py) and the later-level choice (level_choice.py) both read, so that in one pass they
cannot contradict each other. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable

from orchestrator.scheduling.packing.cards import Card, need_mib
from orchestrator.scheduling.packing.types import QueuedJob


def fits_at_s(
    need_mib: int,
    available_mib: int,
    used_slots: int,
    slots: int,
    frees: Iterable[tuple[float, int]],
    now_s: float,
    alone: bool = False,
) -> float | None:
    """When a job needing `need_mib` (its headroom included) is expected to fit on one card: now
    if it does; else the expected end of the running attempt after which the memory and a slot it
    needs are free (`frees`: each attempt's expected end, inf where unknown, and the memory it
    gives back then: those running and those placed earlier in this pass). `alone`: the card
    must be empty. inf: not even once every attempt has ended (other processes hold the rest,
    with or without attempts of ours running); None: an attempt that must end first has no
    expected end."""
    if slots <= 0:
        return math.inf

    def fits(room_mib: int, used: int) -> bool:
        return room_mib >= need_mib and used < slots and (not alone or used == 0)

    room_mib, used = available_mib, used_slots
    if fits(room_mib, used):
        return now_s
    for end_s, mib in sorted(frees):
        if not math.isfinite(end_s):
            return None
        room_mib, used = room_mib + mib, used - 1
        if fits(room_mib, used):
            return max(now_s, end_s)
    return math.inf


def card_fits_at_s(job: QueuedJob, card: Card, now_s: float) -> float | None:
    """fits_at_s for `job` on `card` as this pass left it: its running attempts and the jobs the
    pass placed there (their memory and slots taken, their expected ends giving them back)."""
    return fits_at_s(
        need_mib(job, card),
        card.available_mib,
        card.used_slots,
        card.gpu.slots,
        [*card.frees, *card.placed_frees],
        now_s,
        alone=job.run_alone,
    )
