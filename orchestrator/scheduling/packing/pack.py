"""Memory-aware packing: a pure function of (queue, GPU states, running attempts, policy).

The daemon and the virtual-time simulator in benchmarks/ both call `pack`, which holds the whole
placement policy: paused suites, draining, the ceiling cap, order, fit, backfill, the holds
against starvation and the later exact level where a waiting job ends sooner. Card state and
blockers are in orchestrator.scheduling.packing.cards, the holds in
orchestrator.scheduling.packing.holds, the wait reasons' text in orchestrator.scheduling.waits;
nothing here does I/O.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field, replace

from orchestrator.scheduling.packing.cards import (
    Card,
    blocker,
    cards_of,
    choose,
    fits_now,
    gain,
    headroom_beside_mib,
    headroom_mib,
    is_open,
    on_trial,
    outstanding_reservation_mib,
    place_on,
)
from orchestrator.scheduling.packing.fit_time import card_fits_at_s
from orchestrator.scheduling.packing.fused import (
    ProcessChoice,
    balanced,
    group_room,
    own_mib,
    placed_process,
)
from orchestrator.scheduling.packing.gang import HostState, closest_set, host_blocker, spend
from orchestrator.scheduling.packing.holds import hold_for_starving, index_of, reserve_for_gang
from orchestrator.scheduling.packing.level_choice import (
    move_note,
    own_fit_s,
    sooner_level,
)
from orchestrator.scheduling.packing.types import GpuState, PackingPolicy, QueuedJob, RunningAttempt
from orchestrator.scheduling.waits import Blocker, Wait, WaitKind, held, render

__all__ = [
    "GpuState", "PackingDecision", "PackingPolicy", "Placement", "QueuedJob", "RunningAttempt",
    "can_take_any", "ceiling_mib", "headroom_mib", "outstanding_reservation_mib", "pack", "slot_share_mib",
]


@dataclass(frozen=True)
class Placement:
    job_id: int
    gpu_index: int
    reserved_mib: int  # predicted peak (per rank), recorded with the move to running
    gpu_indices: tuple[int, ...] = ()  # a gang's cards in CUDA_VISIBLE_DEVICES order; () = (gpu_index,)
    capped: bool = False  # its prediction was above every usable card: `reserved_mib` is the cap
    # a later ladder level it starts at because it ends sooner there (QueuedJob.alternatives), and why
    level: int | None = None
    level_note: str = ""
    ahead: bool = False  # started ahead of the memory or slot it needs (--overlap: cards.starts_ahead)
    process: ProcessChoice | None = None  # `share_base: fused`: the process it was counted in
    # a start on trial (orchestrator.scheduling.packing.trial): the room it got, less than its
    # prediction, and its MPS fence; `reserved_mib` is that room; None: an ordinary start
    trial_fence_mib: int | None = None

    @property
    def all_gpus(self) -> tuple[int, ...]:
        return self.gpu_indices or (self.gpu_index,)


@dataclass(frozen=True)
class PackingDecision:
    placements: tuple[Placement, ...] = ()
    waits: dict[int, Wait] = field(default_factory=dict)  # job_id -> why it waits

    @property
    def wait_reasons(self) -> dict[int, str]:
        """job_id -> the reason's text, as the dashboard shows it."""
        return {job_id: render(w) for job_id, w in self.waits.items()}


PLACEMENT_RULES = ("spread", "best_fit")
ORDER_RULES = ("longest_first", "longest_run_first", "fifo")


def can_take_any(gpus: list[GpuState], running: list[RunningAttempt], policy: PackingPolicy) -> bool:
    """False when no card has a free slot with free memory: `pack` would place nothing, so a
    caller may skip building the queue."""
    return any(is_open(card) for card in cards_of(gpus, running, policy).values())


def open_slots(gpus: list[GpuState], running: list[RunningAttempt], policy: PackingPolicy) -> int:
    """Free slots over the cards that could take a job now: no pass places more jobs than this,
    so a caller may hand `pack` only that many of each kind of job (jobs alike but for their
    place in the queue; `pack` takes them in queue order)."""
    return sum(card.gpu.slots - card.used_slots + group_room(card.groups)
               for card in cards_of(gpus, running, policy).values() if is_open(card))


def ceiling_mib(gpus: list[GpuState], policy: PackingPolicy) -> int | None:
    """The most a prediction may say: the largest usable card less its headroom. A prediction
    above every usable card (an inflated estimate or OOM floor) would keep a job queued forever;
    capped, it runs on an empty card and the ladder takes over if it OOMs."""
    return max((g.total_mib - headroom_mib(g, policy) for g in gpus if g.slots > 0), default=None)


def slot_share_mib(gpus: list[GpuState]) -> float:
    """The most memory one plan slot gets on any card (its size over its plan cap); inf when no
    card is in the plan (then no job is weighed)."""
    return max((g.total_mib / g.slots for g in gpus if g.slots > 0), default=math.inf)


def _order_key(job: QueuedJob, rule: str, slot_mib: float = math.inf) -> tuple[int, float, int]:
    """Priority first, always; then, among equals, the largest expected share of the machine.

    A long job started last sets the makespan alone at the end of a sweep, so it goes first and
    short jobs fill in around it. A job predicted to take more memory than one plan slot's share
    of a card (`slot_mib`) keeps that many slots' worth of the card for its run, so its run time
    counts that many times: otherwise short jobs too large to share a card are left for the end,
    where they run one or two to a card while the rest of the machine drains. A job with no
    estimate counts as longest: it may well be, and running it early teaches the estimate for
    its kind; so does a job marked `teaches` (its memory prediction is untaught).
    """
    if rule == "fifo":
        return (-job.priority, 0.0, job.queued_seq)
    expected = math.inf if job.expected_duration_s is None or job.teaches else job.expected_duration_s
    slots_taken = 1.0
    if rule == "longest_first" and 0 < slot_mib < math.inf:
        slots_taken = max(1.0, job.predicted_peak_mib / slot_mib)
    return (-job.priority, -expected * slots_taken, job.queued_seq)


def _wait(job: QueuedJob, cards: list[Card], blockers: dict[int, Blocker | None], now_s: float,
          waits: dict[int, float]) -> Wait:
    """Why a one-GPU job waits: the limiting GPU and the numbers."""
    if not cards:
        # The job's --gpus names only GPUs the readings lack (submitted where they were unknown).
        return Wait(WaitKind.NO_GPU, gpus=tuple(sorted(job.allowed_gpu_indices or ())))
    usable = [c for c in cards if blockers[c.gpu.index] is not Blocker.PLAN]
    if not usable:
        return Wait(WaitKind.NO_SLOTS)
    if all(blockers[c.gpu.index] is Blocker.NEVER for c in usable):
        largest = max(c.gpu.total_mib for c in usable)
        return Wait(WaitKind.NEVER_FITS, need_mib=job.predicted_peak_mib, largest_mib=largest)
    kept = [c for c in usable if blockers[c.gpu.index] is Blocker.HELD]
    if kept:
        c = kept[0]
        assert c.held_for is not None
        kind = WaitKind.HELD_FOR_GANG if c.held_gang else WaitKind.HELD_FOR_STARVING
        return Wait(kind, gpu=c.gpu.index, for_job=c.held_for, ready_in_s=c.held_until_s - now_s,
                    runs_s=job.expected_duration_s, waited_s=now_s - waits.get(c.held_for, now_s))
    short = [c for c in usable if blockers[c.gpu.index] is Blocker.MEMORY]
    if short:
        c = max(short, key=lambda c: c.available_mib - headroom_beside_mib(job, c))
        # a fused member joining its group there needs its own part of the process's peak
        return Wait(WaitKind.MEMORY, gpu=c.gpu.index, free_mib=c.available_mib, reserved_mib=c.reserved_mib,
                    need_mib=own_mib(job, c.groups), headroom_mib=headroom_beside_mib(job, c),
                    trial_held=job.trial_held and c.gpu.fenced and not job.run_alone)
    probing = [c for c in usable if blockers[c.gpu.index] is Blocker.PROBE]
    if probing:
        return Wait(WaitKind.PROBE, gpu=probing[0].gpu.index)
    stacked = [c for c in usable if blockers[c.gpu.index] is Blocker.GAIN]
    if stacked:
        c = stacked[0]
        return Wait(WaitKind.GAIN, gpu=c.gpu.index, gain=gain(job, c) or 0.0, min_gain=job.min_stack_gain or 0.0)
    if job.run_alone:
        return Wait(WaitKind.RUN_ALONE)
    if any(blockers[c.gpu.index] is Blocker.ALONE for c in usable):
        return Wait(WaitKind.CAP_OR_ALONE)
    return Wait(WaitKind.CAP)


def _gang_wait(job: QueuedJob, allowed: list[Card], fits: list[Card], blockers: dict[int, Blocker | None],
               notes: dict[int, str]) -> Wait:
    usable = [c for c in allowed if blockers[c.gpu.index] not in (Blocker.PLAN, Blocker.NEVER)]
    return Wait(WaitKind.GANG, gpus=tuple(c.gpu.index for c in fits), need_mib=job.predicted_peak_mib,
                n_gpus=job.gpus, usable=len(usable), note=notes.get(job.job_id, ""))


def pack(
    queue: list[QueuedJob],
    gpus: list[GpuState],
    running: list[RunningAttempt],
    policy: PackingPolicy,
    now_s: float,
    *,
    host: HostState | None = None,
    topology: Mapping[tuple[int, int], int] | None = None,
    paused: Container[str] = frozenset(),
    paused_configs: Container[tuple[str, str]] = frozenset(),
    draining: bool = False,
    hold: str | None = None,
) -> PackingDecision:
    """Place queued jobs on GPUs; the first `policy.reasons_for` waiting jobs (in packing order
    and in queue order) get a reason.

    Jobs of a `paused` suite or of one of the `paused_configs` ((suite, config)) wait, and so does
    every job while `draining` or a `hold` (why nothing may start now, e.g. a full disk) is given. A
    prediction above every usable card is capped to the largest (`ceiling_mib`; the placement says
    `capped`). Jobs are taken by priority (high first), then longest expected run first (weighted by
    the plan slots its memory takes; policy.order), then queue order. A job that does not fit is
    skipped and later jobs may start around it (backfill), except that the first such job, once it
    has waited `starvation_s` and no single running attempt's end would make room for it, keeps its
    best card (orchestrator.scheduling.packing.holds), and the first multi-GPU job keeps the cards
    it will run on as they free up. Once every job was tried at its own level, a waiting one-GPU job
    may start at a later exact level (`QueuedJob.alternatives`) that fits now and is expected to end
    sooner (orchestrator.scheduling.packing.level_choice; the placement names the level). A fused
    group's jobs without a run time are dealt into processes of one adapter shape, else of like
    work (orchestrator.scheduling.packing.fused.balanced). `host`
    (when given) is spent by every placement: a job whose predicted host RAM or cores do not fit
    waits. `topology` ((i, j) -> distance, i < j) picks the closest cards for a gang. Once no card
    has a free slot with free memory the rest of the queue is not examined.
    """
    if policy.placement not in PLACEMENT_RULES:
        raise ValueError(f"unknown placement rule {policy.placement!r}")
    if policy.order not in ORDER_RULES:
        raise ValueError(f"unknown order rule {policy.order!r}")
    reasons: dict[int, Wait] = {}
    movable: list[QueuedJob] = []
    for job in queue:
        held_back = held(job.suite, paused, draining, hold, config=job.config, paused_configs=paused_configs)
        if held_back is None:
            movable.append(job)
        else:
            reasons[job.job_id] = held_back
    if not movable:
        return PackingDecision((), reasons)
    ceiling = ceiling_mib(gpus, policy)
    capped: set[int] = set()
    if ceiling is not None:
        # a measured peak under the cap needs no cap: its margin counts within the headroom
        capped = {j.job_id for j in movable if j.predicted_peak_mib - j.margin_mib > ceiling}
        movable = [replace(j, predicted_peak_mib=ceiling, margin_mib=0) if j.job_id in capped else j
                   for j in movable]
    return _pack(movable, gpus, running, policy, now_s, host, topology, reasons, capped)


def _pack(
    queue: list[QueuedJob], gpus: list[GpuState], running: list[RunningAttempt], policy: PackingPolicy,
    now_s: float, host: HostState | None, topology: Mapping[tuple[int, int], int] | None,
    reasons: dict[int, Wait], capped: set[int],
) -> PackingDecision:
    cards = cards_of(gpus, running, policy)
    ordered_cards = [c for _, c in sorted(cards.items())]
    waits = {job.job_id: job.waiting_since_s for job in queue}
    placements: list[Placement] = []
    slot_mib = slot_share_mib(gpus)
    ordered = balanced(sorted(queue, key=lambda j: _order_key(j, policy.order, slot_mib)))
    notes = reserve_for_gang(ordered, cards, now_s, topology, host)
    head_seen = False
    # Reasons for the first few in queue order too: the dashboard lists those.
    listed = {
        j.job_id for j in heapq.nsmallest(policy.reasons_for, queue, key=lambda j: (-j.priority, j.queued_seq))
    } if policy.reasons_for > 0 else set()
    any_open = any(is_open(c) for c in ordered_cards)
    explained = 0
    # Jobs alike in what placement reads (peak, GPUs, alone) fail alike until a placement
    # changes a card: a queue of many seeds of few shapes is then one check per shape.
    failed: set[tuple[object, ...]] = set()
    deferred: list[QueuedJob] = []  # jobs that wait at their level but may start at a later one
    trialled: set[tuple[object, ...]] = set()  # kinds of job one of which started on trial this call
    for job in ordered:
        if job.least_mib is not None and _trial_kind(job) in trialled:
            # one trial of a kind at a time: its fit is not shown yet
            job = replace(job, least_mib=None, trial_held=True)
        wanted = explained < policy.reasons_for or job.job_id in listed or not head_seen
        alike = (job.predicted_peak_mib, job.allowed_gpu_indices, job.run_alone, job.gpus, job.host_mib,
                 job.cpus, job.expected_duration_s, job.min_stack_gain,
                 id(job.throughput_by_gpu), job.probe_family, job.ahead_s, job.startup_mib,
                 job.alternatives, job.fuse_group, job.fuse_cap,
                 job.group_peaks, job.least_mib, job.margin_mib)  # one curve object per shape and pass
        if (not any_open or alike in failed) and not wanted:
            continue  # cannot start, and no reason asked for: no work
        allowed = [
            c for c in ordered_cards if job.allowed_gpu_indices is None or c.gpu.index in job.allowed_gpu_indices
        ]
        blockers = {c.gpu.index: blocker(job, c, now_s) for c in allowed}
        fits = [c for c in allowed if blockers[c.gpu.index] is None]
        host_reason = host_blocker(job.host_mib, job.cpus, host)
        if not fits and job.alternatives and job.gpus == 1 and host_reason is None:
            deferred.append(job)  # after every job at its own level: what is left may suit a later one
        if len(fits) >= job.gpus and host_reason is None:
            if job.gpus == 1:
                chosen = [choose(job, fits, policy.placement, now_s)]
            else:
                rank = {c.gpu.index: n for n, c in enumerate(sorted(fits, key=_spread_key(job, policy)))}
                chosen = closest_set(
                    fits, job.gpus, index_of, topology, lambda c, rank=rank: rank[c.gpu.index]  # type: ignore[misc]
                )
            # before place_on takes its room
            trial = on_trial(job, chosen[0], now_s) if job.gpus == 1 else None
            ahead = trial[1] if trial is not None else job.gpus == 1 and not fits_now(job, chosen[0])
            trial_mib = trial[0] if trial is not None else None
            if trial is not None:
                trialled.add(_trial_kind(job))
            # less than its peak: it joins a group, or starts on trial
            reserved = [place_on(card, job, now_s, trial_mib) for card in chosen]
            for card in cards.values():  # holds it did not need: free for the rest of this call
                card.release(job.job_id)
            spend(host, job.host_mib, job.cpus)
            indices = tuple(c.gpu.index for c in chosen)
            placements.append(Placement(job.job_id, indices[0], min(reserved),
                                        indices if job.gpus > 1 else (), job.job_id in capped, ahead=ahead,
                                        process=placed_process(job, chosen[0].groups), trial_fence_mib=trial_mib))
            any_open = any(is_open(c) for c in ordered_cards)
            failed.clear()
            continue
        failed.add(alike)
        if len(fits) >= job.gpus:
            assert host_reason is not None
            if wanted:
                reasons[job.job_id] = host_reason
                explained += 1
            continue
        if job.gpus > 1:
            reasons[job.job_id] = _gang_wait(job, allowed, fits, blockers, notes)
            explained += 1
            continue
        if wanted:
            reasons[job.job_id] = _wait(job, allowed, blockers, now_s, waits)
            explained += 1
        if not head_seen:
            head_seen = True
            if now_s - job.waiting_since_s > policy.starvation_s:
                kept = hold_for_starving(job, allowed, now_s)
                if kept is not None:
                    if job.job_id in reasons:
                        reasons[job.job_id] = replace(reasons[job.job_id], kept_gpu=kept.gpu.index)
                    failed.clear()  # a card now held: blockers of later jobs change
    placements += _at_sooner_levels(deferred, ordered_cards, cards, now_s, host, policy, reasons)
    return PackingDecision(tuple(placements), reasons)


def _trial_kind(job: QueuedJob) -> tuple[object, ...]:
    """Jobs alike for a start on trial: one wrong guess of the least they need is wrong for all."""
    return job.suite, job.config, job.level, job.predicted_peak_mib, job.least_mib


def _at_sooner_levels(deferred: list[QueuedJob], ordered_cards: list[Card], cards: dict[int, Card], now_s: float,
                     host: HostState | None, policy: PackingPolicy, reasons: dict[int, Wait]) -> list[Placement]:
    """Once every job has been tried at its own level: the waiting jobs, in packing order, that
    start at a later exact level where it fits now and ends sooner. Capacity that a job could use
    at its own (faster) level is never spent on a slower one."""
    placements = []
    for job in deferred:
        allowed = [
            c
            for c in ordered_cards
            if job.allowed_gpu_indices is None or c.gpu.index in job.allowed_gpu_indices
        ]
        blockers = {c.gpu.index: blocker(job, c, now_s) for c in allowed}
        if not any(is_open(c) for c in allowed) or host_blocker(job.host_mib, job.cpus, host) is not None:
            continue
        sooner = _at_sooner_level(job, allowed, blockers, now_s)
        if sooner is None:
            continue
        placing, fits, level, note = sooner
        card = choose(placing, fits, policy.placement)
        reserved = place_on(card, placing, now_s)
        for each in cards.values():  # a hold it had: free for the rest of this call
            each.release(job.job_id)
        spend(host, job.host_mib, job.cpus)
        reasons.pop(job.job_id, None)
        # placed as a job of its own (its group at that level is not known here): a fused one opens
        # a process, so that it joins no other the card counted
        opens = job.fuse_group is not None and not placing.run_alone
        placements.append(Placement(job.job_id, card.gpu.index, reserved, level=level,
                                    level_note=note, process=ProcessChoice(True) if opens else None))
    return placements


# blockers a running attempt's end lifts: the job's own level waits for those ends
_WAITS_FOR_ENDS = (Blocker.MEMORY, Blocker.CAP, Blocker.OCCUPIED, Blocker.ALONE)


def _at_sooner_level(job: QueuedJob, allowed: list[Card], blockers: dict[int, Blocker | None],
                     now_s: float) -> tuple[QueuedJob, list[Card], int, str] | None:
    """A one-GPU job that fits no card now at its level, at a later exact level that fits now and
    is expected to end sooner (orchestrator.scheduling.packing.level_choice): the job as placed
    there, the cards it fits, the level and why; None: it waits at its level."""
    per_card: list[float | None] = []
    for c in allowed:
        why = blockers[c.gpu.index]
        if why is Blocker.NEVER:
            per_card.append(math.inf)
        elif why in _WAITS_FOR_ENDS:
            # the running attempts' ends, and those of the jobs this call placed on the card
            at_s = card_fits_at_s(job, c, now_s)
            if at_s is None:
                return None  # an attempt in the way has no expected end: nothing moves on it
            per_card.append(at_s)
        elif why is not Blocker.PLAN:
            per_card.append(None)  # held, probing, too little gain: not a matter of ends
    own_at_s = own_fit_s(per_card)
    if own_at_s is None or job.expected_duration_s is None:
        return None
    fitting = {}
    for option in job.alternatives:
        if not option.exact:
            continue
        # its fused group at that level is not known here: placed as a job of its own
        at = replace(job, predicted_peak_mib=option.predicted_peak_mib, run_alone=option.run_alone,
                     expected_duration_s=option.expected_duration_s, alternatives=(), fuse_group=None,
                     least_mib=None, margin_mib=0)  # its own level's measures say nothing of another
        cards_now = [c for c in allowed if blocker(at, c, now_s) is None]
        if cards_now:
            fitting[option.level] = (option, at, cards_now)
    chosen = sooner_level(job.expected_duration_s, own_at_s, (o for o, _, _ in fitting.values()), now_s)
    if chosen is None:
        return None
    _, at, cards_now = fitting[chosen.level]
    return at, cards_now, chosen.level, move_note(job.level, chosen, job.expected_duration_s, own_at_s, now_s)


def _spread_key(job: QueuedJob, policy: PackingPolicy) -> Callable[[Card], tuple[object, ...]]:
    """The single-job preference, used to break ties between equally close sets of cards."""
    if policy.placement == "best_fit":
        return lambda c: (c.available_mib - job.predicted_peak_mib, c.gpu.index)
    return lambda c: (c.used_slots, -c.available_mib, c.gpu.index)
