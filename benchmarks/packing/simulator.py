"""Discrete-event simulation of one sweep at virtual time.

An attempt first spends the job's `startup_s` (launch to the first training step) holding
`startup_mib`, doing no work and taking no share of the card's compute; then its memory rises
linearly to its true peak over `ramp_s`. When a card's
memory (foreign + ours) reaches its size, the attempt that is allocating — the most recently
started one still ramping — fails with an OOM and its time so far is lost. With k attempts on
a card each runs at T(k)/k of its solo speed. A job may also die of a late OOM at a fixed
fraction of its work (`TraceJob.late_oom_at`). With `resume`, an attempt after a death continues
from the last checkpoint its predecessors wrote (every `checkpoint_every` of the job's work),
the ladder keeping the effective batch, so the fraction of the work carries over between levels.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from benchmarks.packing.trace import Trace, TraceJob

# T(k): total throughput of a card shared by k jobs, in solo-job units (the last entry repeats)
SHARING_THROUGHPUT: tuple[float, ...] = (0.0, 1.0, 1.45, 1.8, 2.0)
# CUDA MPS over plain time-slicing, T_mps(k) / T(k), measured for k jobs of a 210M Llama LoRA
# (bf16, batch 32) on one H200: benchmarks/gpu/results/mps_factors_h200.json
# (`python benchmarks/gpu/mps_bench.py factors`); the last entry repeats
MPS_GAIN: tuple[float, ...] = (0.0, 1.0, 1.101, 1.180, 1.179)
_EPS = 1e-6

Outcome = Literal["succeeded", "oom"]


def with_mps(table: Sequence[float], gain: Sequence[float] = MPS_GAIN) -> tuple[float, ...]:
    """T(k) under MPS: the plain table times the measured gain at each count."""
    return tuple(t * gain[min(k, len(gain) - 1)] for k, t in enumerate(table))


def throughput(k: int, table: Sequence[float] = SHARING_THROUGHPUT) -> float:
    """T(k) for k jobs on one card."""
    return table[min(k, len(table) - 1)]


@dataclass(frozen=True)
class Start:
    """A policy's order to start one job on one card at one ladder level."""

    job_index: int
    gpu_index: int
    level: int
    predicted_mib: float = 0.0  # what the policy believes the peak will be
    run_alone: bool = False
    tag: int = -1  # free for the policy, e.g. the round number


@dataclass
class Attempt:
    start: Start
    job: TraceJob
    start_s: float
    seq: int  # global start order: the latest started ramping attempt is the one that OOMs
    remaining_min: float  # solo minutes of work left
    work_min: float = 0.0  # solo minutes of the whole job at this level
    start_fraction: float = 0.0  # of the work, done before this attempt (resumed from a checkpoint)
    late_oom_remaining_min: float | None = None  # the attempt dies of a late OOM when this much is left

    @property
    def peak_mib(self) -> float:
        return self.job.peak_mib[self.start.level]

    @property
    def startup_end_s(self) -> float:
        return self.start_s + self.job.startup_s

    @property
    def ramp_end_s(self) -> float:
        return self.startup_end_s + self.job.ramp_s

    @property
    def startup_mib(self) -> float:
        return min(self.job.startup_mib, self.peak_mib)

    def held_mib(self, now_s: float) -> float:
        if now_s >= self.ramp_end_s:
            return self.peak_mib
        if now_s < self.startup_end_s:
            return self.startup_mib
        rising = self.peak_mib - self.startup_mib
        return self.startup_mib + rising * (now_s - self.startup_end_s) / self.job.ramp_s

    def starting(self, now_s: float) -> bool:
        """Still before its first training step."""
        return now_s < self.startup_end_s - _EPS

    def ramping(self, now_s: float) -> bool:
        """Allocating: past its start-up, not yet at its peak."""
        return not self.starting(now_s) and now_s < self.ramp_end_s - _EPS

    def rising_mib_per_s(self) -> float:
        return (self.peak_mib - self.startup_mib) / self.job.ramp_s


@dataclass(frozen=True)
class AttemptRecord:
    job_index: int
    gpu_index: int
    level: int
    tag: int
    start_s: float
    end_s: float
    outcome: Outcome
    held_at_end_mib: float
    lost_min: float = 0.0  # an OOM'd attempt's wall minutes whose work no checkpoint kept


@dataclass
class SimResult:
    makespan_min: float
    oom_events: int
    oom_lost_gpu_min: float  # wall minutes of OOM'd attempts, start to failure, less what a checkpoint kept
    failed_jobs: int  # jobs that never succeeded
    mean_wait_min: float  # per job, all time spent queued (before each of its attempts)
    records: list[AttemptRecord] = field(default_factory=list)
    max_used_mib: dict[int, float] = field(default_factory=dict)  # per card, ours + foreign
    max_jobs: dict[int, int] = field(default_factory=dict)  # most attempts at once per card


class ShapeQueue:
    """Queued jobs grouped by shape, each group in queue order.

    Jobs of one shape look alike to a packer (same prediction, same expected run time, same
    level), and a card only fills up during one packing pass, so when at most k of a shape can
    be placed only its first k + 1 can matter: the first k may be placed, the next is the first
    left waiting. `heads` hands a policy just those, and a 10,000-job queue costs a pass a few
    jobs per shape instead of every job.
    """

    def __init__(self) -> None:
        self._groups: dict[Hashable, list[tuple[int, int]]] = {}  # shape -> sorted (seq, job)
        self._where: dict[int, Hashable] = {}  # job -> its shape

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, job_index: object) -> bool:
        return job_index in self._where

    def add(self, job_index: int, shape: Hashable, seq: int) -> None:
        self.remove(job_index)
        bisect.insort(self._groups.setdefault(shape, []), (seq, job_index))
        self._where[job_index] = shape

    def remove(self, job_index: int) -> None:
        shape = self._where.pop(job_index, None)
        if shape is None:
            return
        group = self._groups[shape]
        group.pop(next(i for i, (_, j) in enumerate(group) if j == job_index))
        if not group:
            del self._groups[shape]

    def heads(self, k: int) -> Iterator[tuple[Hashable, int]]:
        """(shape, job) for the first `k` jobs of every shape, groups in no fixed order."""
        for shape, group in self._groups.items():
            for _, job_index in group[:k]:
                yield shape, job_index

    def shapes(self) -> Iterator[tuple[Hashable, int]]:
        """(shape, its first job) for every shape in the queue."""
        for shape, group in self._groups.items():
            yield shape, group[0][1]

    def first(self, shape: Hashable, k: int) -> list[int]:
        """The first `k` jobs of `shape`, in queue order."""
        return [job_index for _, job_index in self._groups.get(shape, [])[:k]]


def most_placeable(peak_mib: int, run_alone: bool, cards: Sequence[tuple[int, int, bool]]) -> int:
    """An upper bound on how many jobs of one peak a packing pass can place on cards given as
    (free slots, free MiB now, occupied): each needs a slot and its peak in free memory
    (reservations and headroom only lower what is free); a job that runs alone needs an
    unoccupied card."""
    if run_alone:
        return sum(1 for slots, free_mib, occupied in cards if slots > 0 and not occupied and free_mib >= peak_mib)
    return sum(min(slots, free_mib // max(1, peak_mib)) for slots, free_mib, _ in cards if slots > 0)


class Policy(Protocol):
    name: str

    def decide(self, sim: Simulator, now_s: float) -> list[Start]: ...

    def on_end(self, sim: Simulator, attempt: Attempt, outcome: Outcome, now_s: float) -> None: ...

    def next_wake_s(self, sim: Simulator, now_s: float) -> float | None: ...

    def finished(self) -> bool: ...


class Simulator:
    def __init__(self, trace: Trace, sharing: Sequence[float] | None = None, *, resume: bool = False,
                 checkpoint_every: float = 0.1) -> None:
        self.trace = trace
        self.resume = resume
        self.checkpoint_every = checkpoint_every
        self._kept = [0.0] * len(trace.jobs)  # per job: fraction of its work a checkpoint holds
        self.sharing = tuple(sharing if sharing is not None else trace.sharing or SHARING_THROUGHPUT)
        self.gpus = {g.index: g for g in trace.gpus}
        self.running: list[Attempt] = []
        self._by_gpu: dict[int, list[Attempt]] = {i: [] for i in self.gpus}  # running, per card
        self._seq = 0
        self._ready_s = [0.0] * len(trace.jobs)
        self._wait_s = [0.0] * len(trace.jobs)
        self._succeeded: set[int] = set()
        self._records: list[AttemptRecord] = []
        self._max_used = {i: g.foreign_mib for i, g in self.gpus.items()}
        self._max_jobs = dict.fromkeys(self.gpus, 0)

    # --- what a policy may read -----------------------------------------------------------
    def on_gpu(self, gpu_index: int) -> list[Attempt]:
        # kept per card as attempts start and end: scanning every running attempt for each
        # card on every event made long traces slow
        return list(self._by_gpu.get(gpu_index, ()))

    def used_mib(self, gpu_index: int, now_s: float) -> float:
        held = sum(a.held_mib(now_s) for a in self.on_gpu(gpu_index))
        return self.gpus[gpu_index].foreign_mib + held

    def free_mib(self, gpu_index: int, now_s: float) -> float:
        return self.gpus[gpu_index].total_mib - self.used_mib(gpu_index, now_s)

    # --- the event loop ---------------------------------------------------------------------
    def _rate(self, attempt: Attempt, now_s: float) -> float:
        if attempt.starting(now_s):
            return 0.0
        k = sum(1 for a in self._by_gpu[attempt.start.gpu_index] if not a.starting(now_s))
        return throughput(k, self.sharing) / k

    def _start(self, start: Start, now_s: float) -> None:
        job = self.trace.jobs[start.job_index]
        self._wait_s[start.job_index] += now_s - self._ready_s[start.job_index]
        work_min = job.minutes[start.level]
        kept = self._kept[start.job_index] if self.resume else 0.0
        late = None
        if job.late_oom_at > kept and start.level < job.late_oom_levels:
            late = work_min * (1.0 - job.late_oom_at)
        attempt = Attempt(start, job, now_s, self._seq, work_min * (1.0 - kept), work_min, kept, late)
        self.running.append(attempt)
        self._by_gpu[start.gpu_index].append(attempt)
        self._seq += 1
        g = start.gpu_index
        self._max_jobs[g] = max(self._max_jobs[g], len(self._by_gpu[g]))

    def _end(self, policy: Policy, attempt: Attempt, outcome: Outcome, now_s: float) -> None:
        held = attempt.held_mib(now_s)
        self.running.remove(attempt)
        self._by_gpu[attempt.start.gpu_index].remove(attempt)
        s = attempt.start
        lost_min = 0.0
        if outcome == "oom":
            lost_min = (now_s - attempt.start_s) / 60.0
            done = 1.0 - attempt.remaining_min / attempt.work_min if attempt.work_min > 0 else 0.0
            checkpointed = int(done / self.checkpoint_every + _EPS) * self.checkpoint_every
            if self.resume and done > attempt.start_fraction and checkpointed > attempt.start_fraction:
                kept_share = (checkpointed - attempt.start_fraction) / (done - attempt.start_fraction)
                lost_min *= 1.0 - min(1.0, kept_share)
                self._kept[s.job_index] = max(self._kept[s.job_index], checkpointed)
        self._records.append(
            AttemptRecord(
                s.job_index, s.gpu_index, s.level, s.tag, attempt.start_s, now_s, outcome, held, lost_min
            )
        )
        if outcome == "succeeded":
            self._succeeded.add(s.job_index)
        self._ready_s[s.job_index] = now_s
        policy.on_end(self, attempt, outcome, now_s)

    def _next_event_s(self, now_s: float) -> float | None:
        times: list[float] = []
        for a in self.running:
            if a.starting(now_s):
                times.append(a.startup_end_s)
                continue
            rate = self._rate(a, now_s)
            times.append(now_s + a.remaining_min / rate * 60.0)
            if a.late_oom_remaining_min is not None:
                times.append(now_s + max(0.0, a.remaining_min - a.late_oom_remaining_min) / rate * 60.0)
            if a.ramping(now_s):
                times.append(a.ramp_end_s)
        for g, gpu in self.gpus.items():
            slope = sum(a.rising_mib_per_s() for a in self.on_gpu(g) if a.ramping(now_s))
            if slope > 0:
                room = gpu.total_mib - self.used_mib(g, now_s)
                times.append(now_s + max(0.0, room) / slope)
        return min(times) if times else None

    def _advance(self, now_s: float, to_s: float) -> None:
        rates = [self._rate(a, now_s) for a in self.running]  # constant between events
        for a, rate in zip(self.running, rates, strict=True):
            a.remaining_min -= rate * (to_s - now_s) / 60.0

    def _handle_events(self, policy: Policy, now_s: float) -> None:
        for a in [a for a in self.running if a.remaining_min <= _EPS]:
            self._end(policy, a, "succeeded", now_s)
        for a in [a for a in self.running
                  if a.late_oom_remaining_min is not None and a.remaining_min <= a.late_oom_remaining_min + _EPS]:
            self._end(policy, a, "oom", now_s)
        for g, gpu in self.gpus.items():
            while True:
                used = self.used_mib(g, now_s)
                self._max_used[g] = max(self._max_used[g], min(used, gpu.total_mib))
                allocating = [a for a in self.on_gpu(g) if a.ramping(now_s)]
                if used < gpu.total_mib - _EPS or not allocating:
                    break
                self._end(policy, max(allocating, key=lambda a: a.seq), "oom", now_s)

    def run(self, policy: Policy) -> SimResult:
        now_s = 0.0
        while True:
            for start in policy.decide(self, now_s):
                self._start(start, now_s)
            candidates = [
                t
                for t in (self._next_event_s(now_s), policy.next_wake_s(self, now_s))
                if t is not None
            ]
            if not candidates:
                break  # nothing runs and nothing will start: done, or the policy gave up
            to_s = max(now_s, min(candidates))
            self._advance(now_s, to_s)
            now_s = to_s
            self._handle_events(policy, now_s)
        return self._result()

    def _result(self) -> SimResult:
        ooms = [r for r in self._records if r.outcome == "oom"]
        n = len(self.trace.jobs)
        return SimResult(
            makespan_min=max((r.end_s for r in self._records), default=0.0) / 60.0,
            oom_events=len(ooms),
            oom_lost_gpu_min=sum(r.lost_min for r in ooms),
            failed_jobs=n - len(self._succeeded),
            mean_wait_min=sum(self._wait_s) / n / 60.0 if n else 0.0,
            records=self._records,
            max_used_mib=self._max_used,
            max_jobs=self._max_jobs,
        )


def best_level(job: TraceJob, trace: Trace) -> int:
    """The fastest level whose true peak fits alone on some card of the plan (and that no late
    OOM strikes)."""
    room = max(g.usable_mib for g, n in zip(trace.gpus, trace.plan, strict=True) if n > 0)
    lowest = job.late_oom_levels if job.late_oom_at > 0 else 0
    fitting = [lv for lv in range(lowest, len(job.minutes)) if job.peak_mib[lv] <= room]
    if not fitting:
        raise ValueError(f"job {job.id} fits no card at any level")
    return min(fitting, key=lambda lv: job.minutes[lv])


def lower_bound_min(trace: Trace, sharing: Sequence[float] | None = None) -> float:
    """max(longest job at its best level, total solo work / Σ_g T(cap_g)).

    cap_g = min(plan_g, how many of the smallest best-level peaks fit in card g's memory).
    """
    sharing = sharing if sharing is not None else trace.sharing or SHARING_THROUGHPUT
    best = [
        (job.minutes[lv], job.peak_mib[lv]) for job in trace.jobs for lv in [best_level(job, trace)]
    ]
    longest = max(job.minutes[best_level(job, trace)] + job.startup_s / 60.0 for job in trace.jobs)
    peaks = sorted(p for _, p in best)
    capacity = 0.0
    for gpu, slots in zip(trace.gpus, trace.plan, strict=True):
        fit, used = 0, 0.0
        for p in peaks[:slots]:
            if used + p > gpu.usable_mib:
                break
            fit, used = fit + 1, used + p
        capacity += throughput(fit, sharing)
    work = sum(m for m, _ in best)
    return max(longest, work / capacity)
