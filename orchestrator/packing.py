"""Memory-aware packing: a pure function of (queue, GPU states, running attempts, policy).

The daemon and the virtual-time simulator in benchmarks/ both call `pack`; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class QueuedJob:
    job_id: int
    priority: int  # higher runs first
    queued_seq: int  # FIFO order among equal priorities (smaller = earlier)
    predicted_peak_mib: int
    waiting_since_s: float  # when the job (re)entered the queue, same clock as `now_s`
    allowed_gpu_indices: frozenset[int] | None = None  # None: any GPU in the plan
    run_alone: bool = False  # ladder's last level: the GPU must hold no other job


@dataclass(frozen=True)
class RunningAttempt:
    job_id: int
    gpu_index: int
    predicted_peak_mib: int
    held_mib: int  # what the attempt's process tree holds on its GPU now
    reached_peak: bool  # once True the attempt reserves nothing beyond what it holds
    run_alone: bool = False


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
    starvation_s: float = 600.0  # a head job waiting longer than this blocks backfill on its best GPU


@dataclass(frozen=True)
class Placement:
    job_id: int
    gpu_index: int
    reserved_mib: int  # predicted peak, recorded with the move to running


@dataclass(frozen=True)
class PackingDecision:
    placements: tuple[Placement, ...] = ()
    wait_reasons: dict[int, str] = field(default_factory=dict)  # job_id -> human-readable reason


def outstanding_reservation_mib(attempt: RunningAttempt) -> int:
    """Memory an attempt still ramping up is expected to take beyond what it holds now."""
    if attempt.reached_peak:
        return 0
    return max(0, attempt.predicted_peak_mib - attempt.held_mib)


def pack(
    queue: list[QueuedJob],
    gpus: list[GpuState],
    running: list[RunningAttempt],
    policy: PackingPolicy,
    now_s: float,
) -> PackingDecision:
    raise NotImplementedError  # implemented with its tests
