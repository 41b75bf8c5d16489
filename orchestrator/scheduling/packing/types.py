"""The packing types: a queued job, a running attempt, one card's state and the policy knobs.
Plain values, so the packer, the card view and the holds import them without importing each other."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.prediction.fused_groups import GroupPeak
from orchestrator.scheduling.packing.level_choice import LevelOption


@dataclass(frozen=True)
class QueuedJob:
    job_id: int
    priority: int  # higher runs first
    queued_seq: int  # FIFO order among equal priorities (smaller = earlier)
    predicted_peak_mib: int
    # when its wait began, on the scale of `now_s`: the daemon measures the wait on its monotonic
    # clock (orchestrator.scheduling.queue_waits), so a wall-clock step moves both alike
    waiting_since_s: float
    allowed_gpu_indices: frozenset[int] | None = None  # None: any GPU in the plan
    run_alone: bool = False  # ladder's last level: the GPU must hold no other job
    # learned from completed attempts of the same config/task; None: nothing comparable ran yet
    expected_duration_s: float | None = None
    # GPU index -> {jobs on the card: aggregate throughput in solo-job units}, measured for this
    # job's shape (orchestrator.prediction.throughput); None or missing GPUs: nothing measured yet
    throughput_by_gpu: Mapping[int, Mapping[int, float]] | None = None
    # the suite's `min_stack_gain`: no stacking where the measured marginal gain is below it
    min_stack_gain: float | None = None
    gpus: int = 1  # a gang: this many cards, each fitting `predicted_peak_mib` (per rank), at once
    host_mib: int = 0  # predicted host RAM of the whole process tree (0: nothing known)
    cpus: int | None = None  # cores the suite asks for; None: not counted
    suite: str = ""  # a paused suite's jobs wait
    config: str = ""  # and so do a paused config's
    # the first queued job of a group whose memory nothing has taught yet (orchestrator.scheduling.teaching):
    # ordered as a job with no run-time estimate, so that it runs early and teaches the rest
    teaches: bool = False
    # its memory family (orchestrator.prediction.families) while the family has measured nothing: one such
    # job per family per card until a running one reaches step K (probe before stacking)
    probe_family: str | None = None
    # learned for its config: how far ahead it may start (its start-up less the lead before its
    # first step) and what it holds until then (orchestrator.prediction.startup.ahead_s,
    # orchestrator.scheduling.packing.overlap); None: not known, never started ahead
    ahead_s: float | None = None
    startup_mib: int = 0
    # later ladder levels it could start at instead, where one ends sooner (exact rungs only:
    # orchestrator.scheduling.packing.level_choice); () keeps it at its level
    alternatives: tuple[LevelOption, ...] = ()
    level: int = 0  # its ladder level (what a note on a move names)
    # `share_base: fused`: its group (orchestrator.prediction.fused_groups) and the most members a
    # group of it may have now; a card where its group runs with room takes it for its own need
    # (orchestrator.scheduling.packing.fused)
    fuse_group: str | None = None
    fuse_cap: int = 1
    # its shape's process peaks learned per group size (`|fused<k>` records); (): none learned
    group_peaks: tuple[GroupPeak, ...] = ()
    # what it adds to each tick of its fused group, relative (orchestrator.prediction.fused_groups.member_work)
    fuse_work: float = 1.0
    # which of its group's members it stacks with (orchestrator.prediction.fused_groups.member_stack);
    # None: with none
    fuse_stack: str | None = None
    # what a process of its base holds before its own needs, as the memory estimate counts it (weights and
    # CUDA context; orchestrator.prediction.memory.estimated_base_mib): a joiner's share until a member's
    # share.json says what the base holds; None: the model's shape is unknown
    estimated_base_mib: int | None = None
    # the least it could need (orchestrator.prediction.least): on a fenced card it may start on
    # trial into less room than its prediction asks (orchestrator.scheduling.packing.trial); None: never
    least_mib: int | None = None
    # the part of its prediction that is margin over its shape's peak measured to completion (a job
    # of its own process): the card's headroom covers that margin, so it counts within the
    # headroom, not beside it (orchestrator.scheduling.packing.cards.headroom_beside_mib); 0: none such
    margin_mib: int = 0
    # on a fenced card it would be offered a start on trial, but one of its kind started on trial has
    # not shown its peak yet (orchestrator.prediction.learned.unproven_trials): its wait says so
    trial_held: bool = False


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
    # its memory family while that family has measured nothing (its probe, before step K)
    probe_family: str | None = None
    # `share_base: fused`: its group, the group's cap, and the base's resident MiB in its
    # process as its share.json says (None: not known yet)
    fuse_group: str | None = None
    fuse_cap: int = 1
    base_mib: int | None = None
    group_peaks: tuple[GroupPeak, ...] = ()  # its shape's process peaks per group size, as QueuedJob's
    # a fused member: the GPU memory its warm process (share.json's pid) holds on this card now, as
    # the snapshot read it; None: not read (no share.json yet, or the probe sees no processes)
    process_mib: int | None = None
    # a fused member placed at its whole prediction, the base included (it opened its process);
    # False: it joined one, placed for its own needs only
    opened_process: bool = True
    # a fused member: the process the daemon placed it in (the id of the attempt that opened it);
    # None: not recorded (placed before orch named processes)
    fuse_process: int | None = None


@dataclass(frozen=True)
class GpuState:
    index: int
    uuid: str
    total_mib: int
    free_mib: int  # live free memory: foreign and our own processes already subtracted
    slots: int  # plan cap; 0 keeps the GPU visible but unused
    fenced: bool = False  # its workers run under orch's MPS control daemon, each with its own fence


@dataclass(frozen=True)
class PackingPolicy:
    headroom_fraction: float = 0.10  # of each card's total, kept free beside every job
    starvation_s: float = (
        600.0  # a head job waiting longer than this blocks backfill on its best GPU
    )
    # which fitting GPU a job gets: "spread" (fewest jobs, then most free memory) or "best_fit"
    # (least memory left over); the packing benchmark decides the default
    placement: str = "spread"
    # order among jobs of equal priority: "longest_first" (expected run time, times the plan
    # slots its predicted memory takes beyond one slot's share of a card; jobs with no
    # estimate first, ties in queue order), "longest_run_first" (run time only: classic
    # longest-processing-time order) or "fifo" (queue order only)
    order: str = "longest_first"
    # headroom is never more than this: 10% of a 141 GiB card (14 GiB) would waste half of a
    # 24 GiB share of it; None = no cap
    headroom_max_mib: int | None = 4096
    # a waiting job's reason costs a pass over the cards: only the first this many jobs in packing
    # order, and the first this many in queue order (the dashboard's list), get one per call
    reasons_for: int = 50
    # start a job `ahead_s` ahead of the running attempts whose end makes room for it
    # (orchestrator.scheduling.packing.overlap)
    overlap: bool = False
