"""The launchers orch replaces, as the packing benchmark races them: bash rounds and slot queues.
Each knows only what a real one would know."""

from __future__ import annotations

from collections import deque

from benchmarks.packing.simulator import Attempt, Outcome, Simulator, Start
from benchmarks.packing.trace import RUN_ALONE_LEVEL, Trace

MAX_RETRIES = 3  # simple queues retry an OOM'd job unchanged this many times


def _slot_gpus(trace: Trace) -> list[int]:
    """Bash launchers' slot list: GPU g repeated plan_g times."""
    return [g.index for g, n in zip(trace.gpus, trace.plan, strict=True) for _ in range(n)]


class RoundsPolicy:
    """Suite sliced into rounds of Σ slots in trace order; each round waits for its slowest job.

    Without `rerun` an OOM fails the job for good. With it, jobs that failed are re-run by hand
    at level+1 in further rounds after the suite ends; level 4 gets a card to itself.
    """

    def __init__(self, trace: Trace, rerun: bool = False) -> None:
        self.name = "rounds+rerun" if rerun else "rounds"
        self.rerun = rerun
        self.trace = trace
        self.slots = _slot_gpus(trace)
        self.alone_slots = [g.index for g, n in zip(trace.gpus, trace.plan, strict=True) if n > 0]
        self.rounds: deque[list[tuple[int, int]]] = deque()
        self._slice([(j, 0) for j in range(len(trace.jobs))], self.slots)
        self.failed: list[tuple[int, int]] = []
        self.round_no = 0

    def _slice(self, jobs: list[tuple[int, int]], slots: list[int]) -> None:
        for i in range(0, len(jobs), len(slots)):
            self.rounds.append(jobs[i : i + len(slots)])

    def decide(self, sim: Simulator, now_s: float) -> list[Start]:
        if sim.running:
            return []
        if not self.rounds and self.failed:
            again = [(j, lv + 1) for j, lv in self.failed if lv < RUN_ALONE_LEVEL]
            self.failed = []
            self._slice([x for x in again if x[1] < RUN_ALONE_LEVEL], self.slots)
            self._slice([x for x in again if x[1] == RUN_ALONE_LEVEL], self.alone_slots)
        if not self.rounds:
            return []
        self.round_no += 1
        batch = self.rounds.popleft()
        slots = self.alone_slots if batch[0][1] == RUN_ALONE_LEVEL else self.slots
        return [
            Start(j, gpu, lv, run_alone=lv == RUN_ALONE_LEVEL, tag=self.round_no)
            for (j, lv), gpu in zip(batch, slots, strict=False)
        ]

    def on_end(self, sim: Simulator, attempt: Attempt, outcome: Outcome, now_s: float) -> None:
        if outcome == "oom" and self.rerun:
            self.failed.append((attempt.start.job_index, attempt.start.level))

    def next_wake_s(self, sim: Simulator, now_s: float) -> float | None:
        return now_s if not sim.running and self.rounds else None

    def finished(self) -> bool:
        return not self.rounds and not self.failed


class SlotsPolicy:
    """Start the next job whenever a plan slot frees, without looking at memory.

    `threshold` also waits until the card's live free memory exceeds the job's declared need,
    with no reservation for jobs still ramping up. Both keep strict FIFO order, put an OOM'd
    job back at the end of the queue unchanged, and give up after `MAX_RETRIES` retries.
    """

    def __init__(self, trace: Trace, threshold: bool = False) -> None:
        self.name = "threshold" if threshold else "slots"
        self.threshold = threshold
        self.trace = trace
        self.queue: deque[int] = deque(range(len(trace.jobs)))
        self.ooms = [0] * len(trace.jobs)

    def _fits(self, sim: Simulator, gpu_index: int, job_index: int, now_s: float) -> bool:
        if not self.threshold:
            return True
        return sim.free_mib(gpu_index, now_s) > self.trace.jobs[job_index].declared_mib

    def decide(self, sim: Simulator, now_s: float) -> list[Start]:
        starts: list[Start] = []
        used = {g.index: len(sim.on_gpu(g.index)) for g in self.trace.gpus}
        while self.queue:
            head = self.queue[0]
            free_slots = [
                g.index
                for g, n in zip(self.trace.gpus, self.trace.plan, strict=True)
                if used[g.index] < n and self._fits(sim, g.index, head, now_s)
            ]
            if not free_slots:
                break
            self.queue.popleft()
            used[free_slots[0]] += 1
            starts.append(Start(head, free_slots[0], 0))
        return starts

    def on_end(self, sim: Simulator, attempt: Attempt, outcome: Outcome, now_s: float) -> None:
        j = attempt.start.job_index
        if outcome == "oom":
            self.ooms[j] += 1
            if self.ooms[j] <= MAX_RETRIES:
                self.queue.append(j)

    def next_wake_s(self, sim: Simulator, now_s: float) -> float | None:
        return None  # only the end of an attempt frees a slot or memory

    def finished(self) -> bool:
        return not self.queue
