"""Memory-aware packing: a pure function of (queue, GPU states, running attempts, policy).

The daemon and the virtual-time simulator in benchmarks/ both call `pack`; nothing here does I/O.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from orchestrator.gang import (
    HostState,
    closest_set,
    host_blocker,
    may_backfill,
    minutes,
    ready_at_s,
    spend,
)
from orchestrator.throughput import marginal_gain


@dataclass(frozen=True)
class QueuedJob:
    job_id: int
    priority: int  # higher runs first
    queued_seq: int  # FIFO order among equal priorities (smaller = earlier)
    predicted_peak_mib: int
    waiting_since_s: float  # when the job (re)entered the queue, same clock as `now_s`
    allowed_gpu_indices: frozenset[int] | None = None  # None: any GPU in the plan
    run_alone: bool = False  # ladder's last level: the GPU must hold no other job
    # learned from completed attempts of the same config/task; None: nothing comparable ran yet
    expected_duration_s: float | None = None
    # GPU index -> {jobs on the card: aggregate throughput in solo-job units}, measured for this
    # job's shape (orchestrator.throughput); None or missing GPUs: nothing measured yet
    throughput_by_gpu: Mapping[int, Mapping[int, float]] | None = None
    # the suite's `min_stack_gain`: no stacking where the measured marginal gain is below it
    min_stack_gain: float | None = None
    gpus: int = 1  # a gang: this many cards, each fitting `predicted_peak_mib` (per rank), at once
    host_mib: int = 0  # predicted host RAM of the whole process tree (0: nothing known)
    cpus: int | None = None  # cores the suite asks for; None: not counted


@dataclass(frozen=True)
class RunningAttempt:
    job_id: int
    gpu_index: int
    predicted_peak_mib: int
    held_mib: int  # what the attempt's process tree holds on its GPU now
    reached_peak: bool  # once True the attempt reserves nothing beyond what it holds
    run_alone: bool = False
    # when the attempt is expected to end (its start + the learned duration); None: unknown.
    # A gang's attempt is one RunningAttempt per card it runs on.
    expected_end_s: float | None = None


@dataclass(frozen=True)
class GpuState:
    index: int
    uuid: str
    total_mib: int
    free_mib: int  # live free memory: foreign and our own processes already subtracted
    slots: int  # plan cap; 0 keeps the GPU visible but unused


@dataclass(frozen=True)
class PackingPolicy:
    headroom_fraction: float = 0.10  # of each card's total, kept free beside every job
    starvation_s: float = (
        600.0  # a head job waiting longer than this blocks backfill on its best GPU
    )
    # which fitting GPU a job gets: "spread" (fewest jobs, then most free memory) or "best_fit"
    # (least memory left over); the packing benchmark decides the default
    placement: str = "spread"
    # order among jobs of equal priority: "longest_first" (expected run time, jobs with no
    # estimate first, ties in queue order) or "fifo" (queue order only)
    order: str = "longest_first"
    # headroom is never more than this: 10% of a 141 GiB card (14 GiB) would waste half of a
    # 24 GiB share of it; None = no cap
    headroom_max_mib: int | None = 4096
    # a waiting job's reason costs a pass over the cards: only the first this many jobs in packing
    # order, and the first this many in queue order (the dashboard's list), get one per call
    reasons_for: int = 50


@dataclass(frozen=True)
class Placement:
    job_id: int
    gpu_index: int
    reserved_mib: int  # predicted peak (per rank), recorded with the move to running
    gpu_indices: tuple[int, ...] = ()  # a gang's cards in CUDA_VISIBLE_DEVICES order; () = (gpu_index,)

    @property
    def all_gpus(self) -> tuple[int, ...]:
        return self.gpu_indices or (self.gpu_index,)


@dataclass(frozen=True)
class PackingDecision:
    placements: tuple[Placement, ...] = ()
    wait_reasons: dict[int, str] = field(default_factory=dict)  # job_id -> human-readable reason


def outstanding_reservation_mib(attempt: RunningAttempt) -> int:
    """Memory an attempt still ramping up is expected to take beyond what it holds now."""
    if attempt.reached_peak:
        return 0
    return max(0, attempt.predicted_peak_mib - attempt.held_mib)


PLACEMENT_RULES = ("spread", "best_fit")
ORDER_RULES = ("longest_first", "fifo")


def headroom_mib(gpu: GpuState, policy: PackingPolicy) -> int:
    """Memory kept free beside every job on this card."""
    fraction_mib = int(policy.headroom_fraction * gpu.total_mib)
    if policy.headroom_max_mib is None:
        return fraction_mib
    return min(fraction_mib, policy.headroom_max_mib)


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


@dataclass
class _Card:
    """One GPU's state while a single `pack` call places jobs on it."""

    gpu: GpuState
    headroom_mib: int
    used_slots: int
    reserved_mib: int  # outstanding reservations of ramping attempts + placements of this call
    ramping_mib: int  # the part of `reserved_mib` owed to running attempts still ramping
    capacity_mib: int  # free memory once our own attempts end: free_mib + what they hold
    occupied: bool  # any running attempt or placement
    alone: bool  # a run_alone attempt or placement holds the card
    held_for: int | None = None  # job id of a starving job or waiting gang this card is kept for
    held_until_s: float = math.inf  # when the gang's reservation completes (backfill ends by then)
    held_need_mib: int | None = None  # what the gang's rank needs here; None: the whole card
    ends_s: list[float | None] = field(default_factory=list)  # running attempts' expected ends

    @property
    def available_mib(self) -> int:
        return self.gpu.free_mib - self.reserved_mib


def _cards(
    gpus: list[GpuState], running: list[RunningAttempt], policy: PackingPolicy
) -> dict[int, _Card]:
    cards = {
        g.index: _Card(g, headroom_mib(g, policy), 0, 0, 0, g.free_mib, False, False) for g in gpus
    }
    for attempt in running:
        card = cards.get(attempt.gpu_index)
        if card is None:  # a GPU outside the plan: nothing to pack there
            continue
        owed = outstanding_reservation_mib(attempt)
        card.used_slots += 1
        card.reserved_mib += owed
        card.ramping_mib += owed
        card.capacity_mib += attempt.held_mib
        card.occupied = True
        card.alone = card.alone or attempt.run_alone
        card.ends_s.append(attempt.expected_end_s)
    return cards


def _open(card: _Card) -> bool:
    """Whether any job at all could start on this card now (a free slot and some memory)."""
    return (
        card.gpu.slots > 0
        and not card.alone
        and card.used_slots < card.gpu.slots
        and card.available_mib > 0
    )


def can_take_any(gpus: list[GpuState], running: list[RunningAttempt], policy: PackingPolicy) -> bool:
    """False when no card has a free slot with free memory: `pack` would place nothing, so a
    caller may skip building the queue."""
    return any(_open(card) for card in _cards(gpus, running, policy).values())


def _headroom_for(job: QueuedJob, card: _Card) -> int:
    """Headroom, capped so that a job predicted to fill most of a card may still have it alone."""
    return max(0, min(card.headroom_mib, card.gpu.total_mib - job.predicted_peak_mib))


def _blocker(job: QueuedJob, card: _Card, now_s: float = 0.0) -> str | None:
    """Why `job` cannot start on `card` now, or None when it can."""
    if card.gpu.slots <= 0:
        return "plan"
    if job.predicted_peak_mib > card.gpu.total_mib:
        return "never"
    if _kept_for_gang(job, card) and not _beside_hold(job, card, now_s):
        return "held"  # said first: the card stays the gang's even after its jobs end
    if card.alone:
        return "alone"
    if card.used_slots >= card.gpu.slots:
        return "cap"
    if job.run_alone and card.occupied:
        return "occupied"
    if job.min_stack_gain is not None:
        gain = _gain(job, card)
        if gain is not None and gain < job.min_stack_gain:
            return "gain"
    if job.predicted_peak_mib + _headroom_for(job, card) > card.available_mib:
        return "memory"
    if card.held_for is not None and card.held_for != job.job_id and not _beside_hold(job, card, now_s):
        return "held"
    return None


def _kept_for_gang(job: QueuedJob, card: _Card) -> bool:
    return card.held_for is not None and card.held_for != job.job_id and card.held_need_mib is not None


def _beside_hold(job: QueuedJob, card: _Card, now_s: float) -> bool:
    """Whether `job` may take a card kept for a waiting gang: it ends before the reservation
    completes, or the card fits both it and the gang's rank within its plan cap."""
    if may_backfill(job.expected_duration_s, now_s, card.held_until_s):
        return True
    if card.held_need_mib is None or job.run_alone or card.used_slots + 2 > card.gpu.slots:
        return False
    return job.predicted_peak_mib + _headroom_for(job, card) + card.held_need_mib <= card.available_mib


def _order_key(job: QueuedJob, rule: str) -> tuple[int, float, int]:
    """Priority first, always; then, among equals, the longest expected run first.

    A long job started last sets the makespan alone at the end of a sweep, so it goes first and
    short jobs fill in around it. A job with no estimate counts as longest: it may well be, and
    running it early teaches the estimate for its kind.
    """
    if rule == "fifo":
        return (-job.priority, 0.0, job.queued_seq)
    expected = math.inf if job.expected_duration_s is None else job.expected_duration_s
    return (-job.priority, -expected, job.queued_seq)


def _gain(job: QueuedJob, card: _Card) -> float | None:
    """Measured throughput one more job of this shape adds to the card (solo-job units)."""
    curve = (job.throughput_by_gpu or {}).get(card.gpu.index)
    return marginal_gain(curve or {}, card.used_slots)


def _choose(job: QueuedJob, fits: list[_Card], rule: str) -> _Card:
    if rule == "best_fit":  # the tightest card keeps large gaps for large jobs
        return min(fits, key=lambda c: (c.available_mib - job.predicted_peak_mib, c.gpu.index))

    # spread: idle cards first; then where the job adds the most measured throughput (an even
    # split, 1/(k+1), where nothing is measured), then the emptiest, then the most free memory
    def key(c: _Card) -> tuple[bool, float, int, int, int]:
        gain = _gain(job, c)
        expected = gain if gain is not None else 1.0 / (c.used_slots + 1)
        return (c.used_slots > 0, -expected, c.used_slots, -c.available_mib, c.gpu.index)

    return min(fits, key=key)


def _best_candidate(job: QueuedJob, cards: list[_Card]) -> _Card | None:
    """The card where a starving job should fit soonest: smallest memory deficit now."""
    possible = [c for c in cards if _blocker(job, c) not in ("plan", "never")]
    if not possible:
        return None

    def deficit(c: _Card) -> tuple[int, int, int]:
        need = job.predicted_peak_mib + _headroom_for(job, c)
        if job.run_alone or c.alone:
            jobs_to_drain = c.used_slots
        else:
            jobs_to_drain = max(0, c.used_slots - c.gpu.slots + 1)
        return (jobs_to_drain, max(0, need - c.available_mib), c.gpu.index)

    return min(possible, key=deficit)


def _wait_reason(
    job: QueuedJob,
    cards: list[_Card],
    blockers: dict[int, str | None],
    now_s: float,
    waits: dict[int, float],
) -> str:
    """One line naming the limiting GPU and the numbers, for the dashboard."""
    if not cards:
        # The job's --gpus names only GPUs the readings lack (submitted where they were unknown).
        return f"GPU {', '.join(map(str, sorted(job.allowed_gpu_indices or ())))} does not exist on this machine"
    usable = [c for c in cards if blockers[c.gpu.index] != "plan"]
    if not usable:
        return "all allowed GPUs have 0 slots in the plan"
    if all(blockers[c.gpu.index] == "never" for c in usable):
        largest = max(usable, key=lambda c: c.gpu.total_mib)
        return (
            f"no GPU can ever fit {_gib(job.predicted_peak_mib)} "
            f"(largest card {_gib(largest.gpu.total_mib)})"
        )
    held = [c for c in usable if blockers[c.gpu.index] == "held"]
    if held:
        c = held[0]
        assert c.held_for is not None
        if not math.isinf(c.held_until_s) or c.held_need_mib is not None:
            runs = "its run time is not known yet" if job.expected_duration_s is None else (
                f"it would run {minutes(job.expected_duration_s)}")
            return (f"held back: GPU {c.gpu.index} reserved for multi-GPU job {c.held_for} "
                    f"(ready in {minutes(c.held_until_s - now_s)}); backfilling only jobs that end before then, "
                    f"{runs}")
        waited_min = (now_s - waits[c.held_for]) / 60.0
        return f"held back: GPU {c.gpu.index} kept free for job {c.held_for} (waiting {waited_min:.0f} min)"
    short = [c for c in usable if blockers[c.gpu.index] == "memory"]
    if short:
        c = max(short, key=lambda c: c.available_mib - _headroom_for(job, c))
        ramping = f" ({_gib(c.reserved_mib)} reserved for ramping jobs)" if c.reserved_mib else ""
        return (
            f"GPU {c.gpu.index}: {_gib(max(0, c.available_mib))} free{ramping}, "
            f"needs {_gib(job.predicted_peak_mib)} + {_gib(_headroom_for(job, c))} headroom"
        )
    stacked = [c for c in usable if blockers[c.gpu.index] == "gain"]
    if stacked:
        c = stacked[0]
        return (
            f"GPU {c.gpu.index}: one more job would add {_gain(job, c) or 0:.0%} throughput "
            f"(measured), below min_stack_gain {job.min_stack_gain:.0%}"
        )
    if job.run_alone:
        return "waiting to run alone on a GPU"
    if any(blockers[c.gpu.index] == "alone" for c in usable):
        return "all allowed GPUs at their plan cap or running a job alone"
    return "all allowed GPUs at their plan cap"


def pack(
    queue: list[QueuedJob],
    gpus: list[GpuState],
    running: list[RunningAttempt],
    policy: PackingPolicy,
    now_s: float,
    *,
    host: HostState | None = None,
    topology: Mapping[tuple[int, int], int] | None = None,
) -> PackingDecision:
    """Place queued jobs on GPUs; the first `policy.reasons_for` waiting jobs (in packing order
    and in queue order) get a reason.

    Jobs are taken by priority (high first), then longest expected run first (policy.order),
    then queue order. A job that does not fit is skipped and later jobs may start around it
    (backfill), except that the first such job, once it has waited `starvation_s`, keeps its best
    card free until it starts there, and the first multi-GPU job keeps the cards it will run on
    as they free up (`orchestrator.gang`). `host` (when given) is spent by every placement: a job
    whose predicted host RAM or cores do not fit waits. `topology` ((i, j) -> distance, i < j)
    picks the closest cards for a gang. Once no
    card has a free slot with free memory the rest of the queue is not examined.
    """
    if policy.placement not in PLACEMENT_RULES:
        raise ValueError(f"unknown placement rule {policy.placement!r}")
    if policy.order not in ORDER_RULES:
        raise ValueError(f"unknown order rule {policy.order!r}")
    cards = _cards(gpus, running, policy)
    ordered_cards = [c for _, c in sorted(cards.items())]
    waits = {job.job_id: job.waiting_since_s for job in queue}
    placements: list[Placement] = []
    reasons: dict[int, str] = {}
    ordered = sorted(queue, key=lambda j: _order_key(j, policy.order))
    gang_note = _reserve_for_gang(ordered, cards, now_s, topology, host)
    head_seen = False
    # Reasons for the first few in queue order too: the dashboard lists those.
    listed = {
        j.job_id for j in heapq.nsmallest(policy.reasons_for, queue, key=lambda j: (-j.priority, j.queued_seq))
    } if policy.reasons_for > 0 else set()
    any_open = any(_open(c) for c in ordered_cards)
    explained = 0
    # Jobs alike in what placement reads (peak, GPUs, alone) fail alike until a placement
    # changes a card: a queue of many seeds of few shapes is then one check per shape.
    failed: set[tuple[object, ...]] = set()
    for job in ordered:
        wanted = explained < policy.reasons_for or job.job_id in listed or not head_seen
        alike = (job.predicted_peak_mib, job.allowed_gpu_indices, job.run_alone, job.gpus, job.host_mib,
                 job.cpus, job.expected_duration_s)
        if (not any_open or alike in failed) and not wanted:
            continue  # cannot start, and no reason asked for: no work
        allowed = [
            c for c in ordered_cards if job.allowed_gpu_indices is None or c.gpu.index in job.allowed_gpu_indices
        ]
        blockers = {c.gpu.index: _blocker(job, c, now_s) for c in allowed}
        fits = [c for c in allowed if blockers[c.gpu.index] is None]
        host_reason = host_blocker(job.host_mib, job.cpus, host)
        if len(fits) >= job.gpus and host_reason is None:
            if job.gpus == 1:
                chosen = [_choose(job, fits, policy.placement)]
            else:
                rank = {c.gpu.index: n for n, c in enumerate(sorted(fits, key=_spread_key(job, policy)))}
                chosen = closest_set(fits, job.gpus, _index, topology, lambda c, rank=rank: rank[c.gpu.index])  # type: ignore[misc]
            for card in chosen:
                card.used_slots += 1
                card.reserved_mib += job.predicted_peak_mib
                card.occupied = True
                card.alone = card.alone or job.run_alone
                if card.held_for == job.job_id:
                    card.held_for, card.held_until_s, card.held_need_mib = None, math.inf, None
            for card in cards.values():  # holds it did not need: free for the rest of this call
                if card.held_for == job.job_id:
                    card.held_for, card.held_until_s, card.held_need_mib = None, math.inf, None
            spend(host, job.host_mib, job.cpus)
            indices = tuple(c.gpu.index for c in chosen)
            placements.append(Placement(job.job_id, indices[0], job.predicted_peak_mib, indices if job.gpus > 1 else ()))
            any_open = any(_open(c) for c in ordered_cards)
            failed.clear()
            continue
        if len(fits) >= job.gpus:
            assert host_reason is not None
            failed.add(alike)
            if wanted:
                reasons[job.job_id] = host_reason
                explained += 1
            continue
        if job.gpus > 1:
            failed.add(alike)
            reasons[job.job_id] = _gang_reason(job, allowed, fits, blockers, gang_note)
            explained += 1
            continue
        failed.add(alike)
        if wanted:
            reasons[job.job_id] = _wait_reason(job, allowed, blockers, now_s, waits)
            explained += 1
        if not head_seen:
            head_seen = True
            if now_s - job.waiting_since_s > policy.starvation_s:
                best = _best_candidate(job, [c for c in allowed if c.held_for is None])
                if best is not None:
                    best.held_for = job.job_id
                    reasons[job.job_id] += f"; GPU {best.gpu.index} kept free for it"
                    failed.clear()  # a card now held: blockers of later jobs change
    return PackingDecision(tuple(placements), reasons)


def _spread_key(job: QueuedJob, policy: PackingPolicy) -> Callable[[_Card], tuple[object, ...]]:
    """The single-job preference, used to break ties between equally close sets of cards."""
    if policy.placement == "best_fit":
        return lambda c: (c.available_mib - job.predicted_peak_mib, c.gpu.index)
    return lambda c: (c.used_slots, -c.available_mib, c.gpu.index)


def _reserve_for_gang(
    ordered: list[QueuedJob], cards: dict[int, _Card], now_s: float,
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
        possible = [c for c in allowed if _blocker(job, c, now_s) not in ("plan", "never")]
        if len(possible) < job.gpus:
            continue  # can never run: its reason says so; it must not hold cards
        if host is not None and job.host_mib > host.total_mib:
            continue
        ready = {c.gpu.index: (now_s if _blocker(job, c, now_s) is None else ready_at_s(now_s, c.ends_s))
                 for c in possible}
        cutoff = sorted(ready.values())[job.gpus - 1]
        pool = [c for c in possible if ready[c.gpu.index] <= cutoff]
        chosen = closest_set(pool, job.gpus, _index, topology,
                             lambda c, ready=ready: (ready[c.gpu.index], c.used_slots, c.gpu.index))  # type: ignore[misc]
        until_s = max(ready[c.gpu.index] for c in chosen)
        for card in chosen:
            card.held_for = job.job_id
            card.held_until_s = until_s
            card.held_need_mib = job.predicted_peak_mib + _headroom_for(job, card)
        free_now = [c.gpu.index for c in chosen if ready[c.gpu.index] <= now_s]
        waiting = [c.gpu.index for c in chosen if ready[c.gpu.index] > now_s]
        note = f"GPUs {_list(free_now + waiting)} reserved for it"
        if waiting:
            note += (f" as they free up (GPU {_list(waiting)} busy; ready in {minutes(until_s - now_s)}); "
                     "backfilling only jobs that end before then")
        return {job.job_id: note}
    return {}


def _index(card: _Card) -> int:
    return card.gpu.index


def _list(indices: list[int]) -> str:
    return ", ".join(map(str, sorted(indices)))


def _gang_reason(
    job: QueuedJob, allowed: list[_Card], fits: list[_Card], blockers: dict[int, str | None],
    gang_note: dict[int, str],
) -> str:
    usable = [c for c in allowed if blockers[c.gpu.index] not in ("plan", "never")]
    need = f"needs {job.gpus} GPUs with {_gib(job.predicted_peak_mib)} + headroom free each"
    if len(usable) < job.gpus:
        return f"{need}, but only {len(usable)} allowed GPU(s) can ever fit a rank"
    reason = f"{need}: {len(fits)} fit now" + (f" (GPU {_list([c.gpu.index for c in fits])})" if fits else "")
    if job.job_id in gang_note:
        reason += f"; {gang_note[job.job_id]}"
    return reason
