"""A start on trial: under an MPS fence, a job may start into less room than its prediction asks,
as long as that room holds the least it could need. Pure.

A prediction is an upper bound with a margin: a running attempt's peak plus 5 to 15 %, or, for a
batch size its memory family has not run, the peak of a larger batch. On a card shared under
`--mps` that margin is what keeps two jobs apart that fit together by their true peaks (on one
H200, a b128 job of TRL predicted by its family's fit from the b256 peak, 14,560 MiB, or by its
running attempt's, beside a b256 at 13,866 MiB and 2.4 GiB of headroom in 24 GiB; its true peak
is 7,948). A peak measured to completion gives its margin to the headroom instead
(orchestrator.scheduling.packing.cards.headroom_beside_mib), so such a job rarely needs a trial. A
job started into the room there is, fenced by MPS at that room, allocates no more than that
room: if it needs more, the out-of-memory error is its own, and orch requeues it at the same
level, not counted (orchestrator.attempts.next_step). Its CUDA context is outside the fence, so
the card's whole headroom stays free beside it. The least it could need
(orchestrator.prediction.least) is a measured peak without its margin, or what its family's
points bound from below, so a trial never starts where it must fail.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestrator.scheduling.packing.overlap import room_ahead_mib

# A trial needs this share above the least it could need: a peak measured to the MiB still varies
# a little between runs (allocator rounding, cuBLAS workspaces).
TRIAL_SLACK_FRACTION = 0.02


def trial_room(*, least_mib: int, headroom_mib: int, available_mib: int, used_slots: int, slots: int,
               overlap: bool, ahead_s: float | None, startup_mib: int, frees: Sequence[tuple[float, int]],
               now_s: float) -> tuple[int, bool] | None:
    """(the room it starts into and is fenced at, whether it starts ahead) for a job whose
    prediction does not fit; None where even the least it could need (plus the slack and its
    headroom) does not. With overlap on, the room may be what the attempts expected to end
    within `ahead_s` free (orchestrator.scheduling.packing.overlap)."""
    need_mib = math.ceil(least_mib * (1 + TRIAL_SLACK_FRACTION)) + headroom_mib
    if used_slots < slots and need_mib <= available_mib:
        return available_mib - headroom_mib, False
    if not overlap:
        return None
    room = room_ahead_mib(startup_mib=startup_mib + headroom_mib, ahead_s=ahead_s, available_mib=available_mib,
                          used_slots=used_slots, slots=slots, frees=frees, now_s=now_s)
    if room is None or need_mib > room:
        return None
    return room - headroom_mib, True
