"""One `pack` call's view of each GPU, and why a job cannot start on one. Pure.

`pack` (orchestrator.scheduling.packing.pack) spends these as it places jobs; the holds for starving jobs and
waiting gangs (orchestrator.scheduling.packing.holds) mark cards kept for one job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from orchestrator.prediction.throughput import marginal_gain
from orchestrator.scheduling.packing.fused import (
    GroupOnCard,
    add_running,
    group_room,
    joining,
    own_mib,
    place_member,
)
from orchestrator.scheduling.packing.gang import may_backfill
from orchestrator.scheduling.packing.overlap import fits_ahead
from orchestrator.scheduling.packing.trial import trial_room
from orchestrator.scheduling.packing.types import (
    GpuState,
    PackingPolicy,
    QueuedJob,
    RunningAttempt,
)
from orchestrator.scheduling.waits import Blocker


def outstanding_reservation_mib(attempt: RunningAttempt) -> int:
    """Memory an attempt still ramping up is expected to take beyond what it holds now."""
    if attempt.reached_peak:
        return 0
    return max(0, attempt.predicted_peak_mib - attempt.held_mib)


def headroom_mib(gpu: GpuState, policy: PackingPolicy) -> int:
    """Memory kept free beside every job on this card."""
    fraction_mib = int(policy.headroom_fraction * gpu.total_mib)
    if policy.headroom_max_mib is None:
        return fraction_mib
    return min(fraction_mib, policy.headroom_max_mib)


@dataclass
class Card:
    """One GPU's state while a single `pack` call places jobs on it."""

    gpu: GpuState
    headroom_mib: int
    used_slots: int
    reserved_mib: int  # outstanding reservations of ramping attempts + placements of this call
    occupied: bool  # any running attempt or placement
    alone: bool  # a run_alone attempt or placement holds the card
    held_for: int | None = None  # job id of a starving job or waiting gang this card is kept for
    held_gang: bool = False  # kept for a multi-GPU job (else for a starving one-GPU job)
    held_until_s: float = math.inf  # when the kept-for job is expected to fit (backfill ends by then)
    held_need_mib: int | None = None  # what the kept-for job needs here; None: the whole card
    ends_s: list[float | None] = field(default_factory=list)  # running attempts' expected ends
    # (expected end, memory it frees then: what it holds plus what it still reserves), per attempt
    frees: list[tuple[float, int]] = field(default_factory=list)
    # the same for the jobs this pack call placed here (their expected end: now + their run time)
    placed_frees: list[tuple[float, int]] = field(default_factory=list)
    probing: set[str] = field(default_factory=set)  # families measuring their memory here (probes)
    overlap: bool = False  # a job may start ahead of the attempts whose end makes room for it
    groups: dict[str, GroupOnCard] = field(default_factory=dict)  # fused groups here (packing.fused)

    @property
    def available_mib(self) -> int:
        return self.gpu.free_mib - self.reserved_mib

    def release(self, job_id: int) -> None:
        """The kept-for job started (or needs the card no more): the card is free for the rest."""
        if self.held_for == job_id:
            self.held_for, self.held_gang, self.held_until_s, self.held_need_mib = None, False, math.inf, None


def cards_of(gpus: list[GpuState], running: list[RunningAttempt], policy: PackingPolicy) -> dict[int, Card]:
    cards = {g.index: Card(g, headroom_mib(g, policy), 0, 0, False, False, overlap=policy.overlap)
             for g in gpus}
    for attempt in running:
        card = cards.get(attempt.gpu_index)
        if card is None:  # a GPU outside the plan: nothing to pack there
            continue
        owed = outstanding_reservation_mib(attempt)
        card.used_slots += add_running(card.groups, attempt, owed)  # a fused group's members share one
        card.reserved_mib += owed
        card.occupied = True
        card.alone = card.alone or attempt.run_alone
        card.ends_s.append(attempt.expected_end_s)
        end_s = math.inf if attempt.expected_end_s is None else attempt.expected_end_s
        card.frees.append((end_s, attempt.held_mib + owed))
        if attempt.probe_family is not None:
            card.probing.add(attempt.probe_family)
    return cards


def is_open(card: Card) -> bool:
    """Whether any job at all could start on this card now (a free slot and some memory, or, with
    overlap, a running attempt with an expected end)."""
    if card.gpu.slots <= 0 or card.alone:
        return False
    if (card.used_slots < card.gpu.slots or group_room(card.groups)) and card.available_mib > 0:
        return True  # a free slot, or a fused group with room (its members join without one)
    return card.overlap and any(end_s < math.inf for end_s, _ in card.frees)


def headroom_for(job: QueuedJob, card: Card) -> int:
    """Headroom, capped so that a job predicted to fill most of a card may still have it alone."""
    return max(0, min(card.headroom_mib, card.gpu.total_mib - job.predicted_peak_mib))


def headroom_beside_mib(job: QueuedJob, card: Card) -> int:
    """What the card keeps free beside the job's prediction: its headroom less the margin the
    prediction already holds over a measured peak. Both are slack for what a measured peak may
    not show again, so the card keeps the headroom free beyond that peak once, not beyond the
    peak and the margin (on a 24 GiB card a measured 13,866 MiB peak and a 7,948 MiB one fit
    together beside the headroom; with the margin beside it, they did not). A start-up hold is
    not the peak the margin is over: beside it the whole headroom stays free (starts_ahead)."""
    return max(0, headroom_for(job, card) - job.margin_mib)


def need_mib(job: QueuedJob, card: Card) -> int:
    """Its prediction (its own needs where it joins a fused group here) and what is kept free beside it."""
    return own_mib(job, card.groups) + headroom_beside_mib(job, card)


def gain(job: QueuedJob, card: Card) -> float | None:
    """Measured throughput one more job of this shape adds to the card (solo-job units)."""
    curve = (job.throughput_by_gpu or {}).get(card.gpu.index)
    return marginal_gain(curve or {}, card.used_slots)


def blocker(job: QueuedJob, card: Card, now_s: float = 0.0) -> Blocker | None:
    """Why `job` cannot start on `card` now, or None when it can."""
    if card.gpu.slots <= 0:
        return Blocker.PLAN
    if job.predicted_peak_mib > card.gpu.total_mib:
        return Blocker.NEVER
    if card.held_for is not None and card.held_for != job.job_id and card.held_need_mib is not None \
            and not beside_hold(job, card, now_s):
        return Blocker.HELD  # said first: the card stays the kept-for job's even after its jobs end
    if card.alone:
        return Blocker.ALONE
    if card.used_slots >= card.gpu.slots and joining(job, card.groups) is None and not starts_ahead(job, card, now_s) \
            and on_trial(job, card, now_s) is None:
        return Blocker.CAP
    if job.run_alone and card.occupied:
        return Blocker.OCCUPIED
    if job.probe_family is not None and job.probe_family in card.probing and joining(job, card.groups) is None:
        return Blocker.PROBE  # a fused member joins its group's process at its whole prediction instead
    if job.min_stack_gain is not None:
        measured = gain(job, card)
        if measured is not None and measured < job.min_stack_gain:
            return Blocker.GAIN
    if need_mib(job, card) > card.available_mib and not starts_ahead(job, card, now_s) \
            and on_trial(job, card, now_s) is None:
        return Blocker.MEMORY
    if card.held_for is not None and card.held_for != job.job_id and not beside_hold(job, card, now_s):
        return Blocker.HELD
    return None


def fits_now(job: QueuedJob, card: Card) -> bool:
    """Whether the job fits the card's memory and slots now, without starting ahead."""
    return need_mib(job, card) <= card.available_mib and (
        card.used_slots < card.gpu.slots or joining(job, card.groups) is not None
    )


def starts_ahead(job: QueuedJob, card: Card, now_s: float) -> bool:
    """With overlap on: the job may start now, its start-up overlapping the end of attempts
    that make room for it (orchestrator.scheduling.packing.overlap)."""
    if not card.overlap or job.run_alone or job.gpus > 1:
        return False
    return fits_ahead(need_mib=need_mib(job, card), startup_mib=job.startup_mib + headroom_for(job, card),
                      ahead_s=job.ahead_s, available_mib=card.available_mib, used_slots=card.used_slots,
                      slots=card.gpu.slots, frees=card.frees, now_s=now_s)


def on_trial(job: QueuedJob, card: Card, now_s: float) -> tuple[int, bool] | None:
    """Where the job does not fit at its prediction (now, or ahead with overlap) but may start on
    trial: (the room it starts into, its MPS fence; whether it starts ahead). Only a one-GPU job
    of its own process (not a shared base) on a card whose workers MPS fences."""
    if job.least_mib is None or not card.gpu.fenced or job.gpus > 1 or job.run_alone or job.fuse_group is not None:
        return None
    if fits_now(job, card) or starts_ahead(job, card, now_s):
        return None
    # the card's whole headroom: a trial runs beside others (headroom_for's cut lets a job that
    # nearly fills a card have it alone), and its fence does not count its CUDA context
    found = trial_room(least_mib=job.least_mib, headroom_mib=card.headroom_mib,
                       available_mib=card.available_mib, used_slots=card.used_slots, slots=card.gpu.slots,
                       overlap=card.overlap, ahead_s=job.ahead_s, startup_mib=job.startup_mib, frees=card.frees,
                       now_s=now_s)
    if found is None:
        return None
    room_mib, ahead = found
    return min(room_mib, job.predicted_peak_mib), ahead


def beside_hold(job: QueuedJob, card: Card, now_s: float) -> bool:
    """Whether `job` may take a card kept for another job: it ends before that job is expected to
    fit, or the card fits both it and the kept-for job within its plan cap."""
    if may_backfill(job.expected_duration_s, now_s, card.held_until_s):
        return True
    if card.held_need_mib is None or job.run_alone or card.used_slots + 2 > card.gpu.slots:
        return False
    return need_mib(job, card) + card.held_need_mib <= card.available_mib


def choose(job: QueuedJob, fits: list[Card], rule: str, now_s: float = 0.0) -> Card:
    joins = [c for c in fits if joining(job, c.groups) is not None]
    if joins:  # a card where its fused group runs with room: the base is loaded there already
        fits = joins
    whole = [c for c in fits if on_trial(job, c, now_s) is None]
    if whole:  # a card that fits its prediction before any where it could only start on trial
        fits = whole
    if rule == "best_fit":  # the tightest card keeps large gaps for large jobs
        return min(fits, key=lambda c: (c.available_mib - job.predicted_peak_mib, c.gpu.index))

    # spread: idle cards first; then where the job adds the most measured throughput (an even
    # split, 1/(k+1), where nothing is measured), then the emptiest, then the most free memory
    def key(c: Card) -> tuple[bool, float, int, int, int]:
        measured = gain(job, c)
        expected = measured if measured is not None else 1.0 / (c.used_slots + 1)
        return (c.used_slots > 0, -expected, c.used_slots, -c.available_mib, c.gpu.index)

    return min(fits, key=key)


def place_on(card: Card, job: QueuedJob, now_s: float, trial_mib: int | None = None) -> int:
    """Spend the card on the job; what it reserves there (MiB): the room it got on trial
    (`trial_mib`), else its prediction (its own needs where it joins a fused group)."""
    reserved = own_mib(job, card.groups) if trial_mib is None else trial_mib
    card.used_slots += place_member(job, card.groups, reserved)
    duration_s = job.expected_duration_s  # unknown: it gives its memory back at no known time
    card.placed_frees.append((now_s + duration_s if duration_s is not None else math.inf, reserved))
    card.reserved_mib += reserved
    card.occupied = True
    card.alone = card.alone or job.run_alone
    if job.probe_family is not None:
        card.probing.add(job.probe_family)
    card.release(job.job_id)
    return reserved
