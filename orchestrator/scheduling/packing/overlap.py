"""Start-up overlap: launch a job before the memory it will need is free, when what it holds
while starting fits now and the running attempts expected to end within how far ahead it may
start free the rest. Pure.

A job spends its first seconds (imports, model load, tokenising) holding little GPU memory. A
next job that waits for a running one to end before it even starts loses that time on every
hand-over; started `ahead_s` ahead (its start-up less a lead: orchestrator.prediction.startup),
its first training step comes that lead after the other one ends. A wrong estimate of either is
an OOM like any other: the ladder and resume take it from there.
"""

from __future__ import annotations

from collections.abc import Sequence


def room_ahead_mib(*, startup_mib: int, ahead_s: float | None, available_mib: int, used_slots: int, slots: int,
                   frees: Sequence[tuple[float, int]], now_s: float) -> int | None:
    """The memory a job starting now will find free once its start-up is over: what is free now
    plus what the attempts expected to end within `ahead_s` free. None where it may not start
    ahead: nothing ends by then, a plan slot is not free by then, or its start-up hold
    (`startup_mib`) does not fit now."""
    if ahead_s is None or ahead_s <= 0 or startup_mib > available_mib:
        return None
    horizon_s = now_s + ahead_s + 1e-6  # a wake-up computed as end - ahead_s lands on the end
    ending = [mib for end_s, mib in frees if end_s <= horizon_s]
    if not ending or used_slots - len(ending) >= slots:
        return None
    return available_mib + sum(ending)


def fits_ahead(*, need_mib: int, startup_mib: int, ahead_s: float | None, available_mib: int, used_slots: int,
               slots: int, frees: Sequence[tuple[float, int]], now_s: float) -> bool:
    """Whether a job may start now on a card it does not fit yet.

    `need_mib`: its peak plus headroom; `startup_mib`: what it holds for its first `ahead_s`;
    `available_mib`: the card's free memory less what is promised; `frees`: (expected end, memory
    it frees then) of each running attempt on the card. True when its start-up hold fits now and,
    counting only the attempts expected to end within `ahead_s`, a plan slot and its whole need
    will be free by then."""
    room = room_ahead_mib(startup_mib=startup_mib, ahead_s=ahead_s, available_mib=available_mib,
                          used_slots=used_slots, slots=slots, frees=frees, now_s=now_s)
    return room is not None and need_mib <= room
