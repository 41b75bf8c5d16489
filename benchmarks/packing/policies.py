"""orch in the packing simulator: the real `pack` with per-shape learning and the degradation ladder
(the launchers it replaces are in benchmarks.packing.launchers)."""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from functools import partial

from benchmarks.packing.carry import carried, start_choice
from benchmarks.packing.simulator import (
    Attempt,
    Outcome,
    ShapeQueue,
    Simulator,
    Start,
    most_placeable,
)
from benchmarks.packing.trace import RUN_ALONE_LEVEL, Trace, TraceJob
from orchestrator.lifecycle import AttemptOutcome
from orchestrator.plans.ladder_spec import load_ladder
from orchestrator.prediction.durations import CompletedRun, DurationTable
from orchestrator.prediction.ladder import Level, exact_levels_after, expand_levels, retry_decision
from orchestrator.prediction.memory import Prediction, predict_peak_mib, update_shape
from orchestrator.scheduling.packing.cards import headroom_mib
from orchestrator.scheduling.packing.level_choice import LevelOption
from orchestrator.scheduling.packing.pack import can_take_any, pack
from orchestrator.scheduling.packing.types import GpuState, PackingPolicy, QueuedJob, RunningAttempt
from orchestrator.scheduling.teaching import teaching_jobs, untaught
from orchestrator.store.rows import ShapeMemory

# The traces record true peaks and run times for five configurations in this order: as configured,
# checkpointing, half batch, no data workers, alone (the daemon's default ladder before it put every
# exact rung first). Expanded for a config of batch 2 with data workers, this ladder gives exactly
# them, so the benchmark replays the traces over it.
TRACE_LADDER_SPEC = [{"name": "checkpointing", "checkpointing": True, "logits_to_keep": 1}, "halve_batch",
                     {"data_workers": 0}, "run_alone"]
TRACE_LEVELS: tuple[Level, ...] = tuple(expand_levels(
    load_ladder(TRACE_LADDER_SPEC),
    {"batch_size": 2, "gradient_accumulation_steps": 1, "num_data_workers": 2, "gradient_checkpointing": False},
    one_token_task=True,
))
assert len(TRACE_LEVELS) == RUN_ALONE_LEVEL + 1 and TRACE_LEVELS[RUN_ALONE_LEVEL].run_alone


@dataclass
class _Queued:
    level: int
    since_s: float


@dataclass
class OrchPolicy:
    """The real `pack`, with per-shape learning and the degradation ladder.

    Prediction for a (config, task, level): its measured peak after an attempt of that shape
    succeeded, plus `margin`; else the declared memory, raised to the memory an OOM'd attempt
    of that shape held when it failed (a floor), plus `margin` — the daemon's own rule from
    `orchestrator.prediction.memory`. What follows an OOM is the daemon's `retry_decision` over its default
    ladder (TRACE_LEVELS): one level down, level 4 alone, an OOM there (or the attempt limit)
    fails the job.
    """

    trace: Trace
    packing: PackingPolicy = field(default_factory=PackingPolicy)
    margin: float = 0.05
    name: str = "orch"
    shapes: dict[tuple[str, str, int], ShapeMemory] = field(default_factory=dict)
    queue: dict[int, _Queued] = field(default_factory=dict)
    wait_reasons: dict[int, str] = field(default_factory=dict)
    completed: list[CompletedRun] = field(default_factory=list)  # what the daemon's table holds
    durations: DurationTable = field(default_factory=lambda: DurationTable(()))
    attempts: dict[int, int] = field(default_factory=dict)  # job -> attempts ended so far
    # OOM evidence carried across rungs and start where it fits (orchestrator.prediction.carried),
    # as the daemon does; False: the daemon before them
    carry: bool = True
    # config -> (launch to first step, memory held until then), seen on an attempt past its start-up
    startups: dict[str, tuple[float, int]] = field(default_factory=dict)
    # the level that ends soonest where a later exact rung fits now (QueuedJob.alternatives), as
    # the daemon does; False: the daemon before it
    sooner_levels: bool = True

    def __post_init__(self) -> None:
        self.queue = {}
        self.by_shape = ShapeQueue()
        # no waiting reasons: nothing reads them here, and they cost a pass over the cards each
        self._packing = replace(self.packing, reasons_for=0)
        self._wakes: list[tuple[float, int]] = []
        for j in range(len(self.trace.jobs)):
            self._enqueue(j, 0, 0.0)

    def expected_s(self, job_index: int, level: int) -> float | None:
        """Learned from succeeded attempts only, as the daemon learns it (never trace minutes)."""
        job = self.trace.jobs[job_index]
        return self.durations.expected_s(job.config, job.task, level)

    def expected_at_level_s(self, job_index: int, level: int, from_level: int) -> float | None:
        """Its run time at a later `level`: learned there, else at `from_level` times the rungs'
        learned slowdown (the daemon's DurationTable.expected_at_level_s)."""
        job = self.trace.jobs[job_index]
        return self.durations.expected_at_level_s(job.config, job.task, level, from_level)

    def _expected_end_s(self, attempt: Attempt) -> float | None:
        """Its start plus the learned run time of its kind, as the daemon reckons it."""
        expected = self.expected_s(attempt.start.job_index, attempt.start.level)
        return None if expected is None else attempt.start_s + expected

    def shape_of(self, job: TraceJob, level: int) -> tuple[str, str, int]:
        """The key a job's memory is learned under at a ladder level."""
        return job.shape(level)

    def probe_of(self, job_index: int, level: int, prediction: Prediction) -> str | None:
        """The memory family a queued job probes (one per family per card until step K); None: no probing."""
        return None

    def running_probe_of(self, attempt: Attempt) -> str | None:
        return None

    def predict(self, job_index: int, level: int) -> Prediction:
        """The daemon's own rule (orchestrator.prediction.memory), with no size estimate for trace jobs."""
        job = self.trace.jobs[job_index]
        shape = self.shapes.get(self.shape_of(job, level))
        return predict_peak_mib(shape, None, int(job.declared_mib), self.margin)

    def predict_mib(self, job_index: int, level: int) -> float:
        return self.predict(job_index, level).mib

    def group(self, job_index: int, level: int) -> Hashable | None:
        """The jobs whose prediction one run of this job teaches beyond its own shape
        (orchestrator.scheduling.teaching); None without an estimate: a run teaches only its own shape."""
        return None

    def length_learned(self, job_index: int) -> bool:
        """Whether a run of the job's model and data has reported its prompt lengths."""
        return True

    def _teaching(self, sim: Simulator, firsts: list[tuple[int, int, Prediction, int]]) -> set[int]:
        """The daemon's rule: the first queued job of each group whose prediction is untaught
        and that no running attempt teaches counts as longest."""
        queue = []
        for j, level, prediction, queued in sorted(firsts, key=lambda f: f[0]):
            group = self.group(j, level)
            if group is not None and not untaught(prediction.source, self.length_learned(j)):
                group = None
            queue.append((j, group, queued))
        if all(group is None for _, group, _ in queue):
            return set()
        learning = {self.group(a.start.job_index, a.start.level) for a in sim.running}
        return teaching_jobs(queue, learning)

    def _learn_startups(self, sim: Simulator, now_s: float) -> None:
        for a in sim.running:
            if a.job.startup_s > 0 and not a.starting(now_s):
                self.startups[a.job.config] = (a.job.startup_s, int(a.startup_mib))

    def decide(self, sim: Simulator, now_s: float) -> list[Start]:
        if not self.queue:
            return []
        if self.packing.overlap:
            self._learn_startups(sim, now_s)
        gpus = [
            GpuState(
                g.index, f"sim-{g.index}", int(g.total_mib), int(sim.free_mib(g.index, now_s)), n
            )
            for g, n in zip(self.trace.gpus, self.trace.plan, strict=True)
        ]
        running = [
            RunningAttempt(
                a.start.job_index,
                a.start.gpu_index,
                int(a.start.predicted_mib),
                int(a.held_mib(now_s)),
                reached_peak=not (a.ramping(now_s) or a.starting(now_s)),
                run_alone=a.start.run_alone,
                expected_end_s=self._expected_end_s(a),
                probe_family=self.running_probe_of(a),
            )
            for a in sim.running
        ]
        if not can_take_any(gpus, running, self.packing):
            return []  # pack would place nothing
        on_card = {g.index: [r for r in running if r.gpu_index == g.index] for g in gpus}
        cards = [(g.slots - len(on_card[g.index]), g.free_mib, bool(on_card[g.index])) for g in gpus]
        # Per shape, only the jobs that can matter (ShapeQueue): those that might be placed
        # and the first left waiting; none at all when no shape can be placed.
        queue = []
        placeable = False
        firsts = []
        if self.carry:
            self._start_where_it_fits(gpus)
        for shape, first in list(self.by_shape.shapes()):
            level = self.queue[first].level
            prediction = self.carried(first, level)
            # how many are queued matters only up to two: whether a group has a job to teach
            firsts.append((first, level, prediction, len(self.by_shape.first(shape, 2))))
            predicted_mib = int(prediction.mib)
            expected_s = self.expected_s(first, level)
            alone = TRACE_LEVELS[level].run_alone
            probe = self.probe_of(first, level, prediction)
            k = most_placeable(predicted_mib, alone, cards)
            startup = self.startups.get(self.trace.jobs[first].config) if self.packing.overlap else None
            if startup is not None and not alone:
                k = max(k, 1)  # it may start ahead of an attempt whose end makes room
            alternatives = self.alternatives(first, level) if self.sooner_levels else ()
            for option in alternatives:
                k = max(k, most_placeable(option.predicted_peak_mib, option.run_alone, cards))
            placeable = placeable or k > 0
            for j in self.by_shape.first(shape, k + 1):
                queue.append(
                    QueuedJob(
                        job_id=j,
                        priority=0,
                        queued_seq=j,  # a retried job keeps its place in the queue
                        predicted_peak_mib=predicted_mib,
                        waiting_since_s=self.queue[j].since_s,
                        run_alone=alone,
                        expected_duration_s=expected_s,
                        probe_family=probe,
                        ahead_s=startup[0] if startup else None,
                        startup_mib=startup[1] if startup else 0,
                        alternatives=alternatives,
                        level=level,
                        margin_mib=prediction.source.margin_within_headroom_mib(shared_base=False),
                    )
                )
        if not placeable:
            return []  # no shape fits anywhere: pack would place nothing
        teaching = self._teaching(sim, firsts)
        queue = [replace(q, teaches=True) if q.job_id in teaching else q for q in queue]
        decision = pack(queue, gpus, running, self._packing, now_s)
        self.wait_reasons = decision.wait_reasons
        starts = []
        for p in decision.placements:
            queued = self.queue.pop(p.job_id)
            level = queued.level if p.level is None else p.level  # a later exact level that ends sooner
            self.by_shape.remove(p.job_id)
            starts.append(
                Start(p.job_id, p.gpu_index, level, p.reserved_mib, TRACE_LEVELS[level].run_alone)
            )
        return starts

    def alternatives(self, job_index: int, level: int) -> tuple[LevelOption, ...]:
        """The later levels reached through exact rungs whose run time is known (learned, or the
        job's own estimate times the rungs' learned slowdown), as the daemon offers them to `pack`."""
        if self.expected_s(job_index, level) is None:
            return ()
        options = []
        for later in exact_levels_after(TRACE_LEVELS, level):
            expected_s = self.expected_at_level_s(job_index, later.index, level)
            if expected_s is not None:
                options.append(LevelOption(later.index, int(self.carried(job_index, later.index).mib), expected_s,
                                           exact=True, run_alone=later.run_alone))
        return tuple(options)

    def carried(self, job_index: int, level: int) -> Prediction:
        """`predict`, raised to the OOM evidence at or below `level` (benchmarks.packing.carry)."""
        job, prediction = self.trace.jobs[job_index], self.predict(job_index, level)
        return carried(prediction, self.shapes, partial(self.shape_of, job), level) if self.carry else prediction

    def _start_where_it_fits(self, gpus: list[GpuState]) -> None:
        """Move each shape's queued jobs off a level shown not to fit any card."""
        ceiling = max(g.total_mib - headroom_mib(g, self.packing) for g in gpus if g.slots > 0)
        for shape, first in list(self.by_shape.shapes()):
            level, job = self.queue[first].level, self.trace.jobs[first]
            choice = start_choice(TRACE_LEVELS, level, ceiling, self.shapes, partial(self.shape_of, job),
                                  partial(self.carried, first))
            if choice is None:
                continue
            for j in [j for j, q in self.queue.items()
                      if q.level == level and self.shape_of(self.trace.jobs[j], level) == shape]:
                self.by_shape.remove(j)
                self.queue[j] = _Queued(choice.level, self.queue[j].since_s)
                self.by_shape.add(j, self.shape_of(self.trace.jobs[j], choice.level), j)

    def on_end(self, sim: Simulator, attempt: Attempt, outcome: Outcome, now_s: float) -> None:
        s = attempt.start
        key = self.shape_of(attempt.job, s.level)
        held = int(attempt.held_mib(now_s))  # the worker reports its peak; an OOM what it held
        self.attempts[s.job_index] = self.attempts.get(s.job_index, 0) + 1
        if outcome == "succeeded":
            self.shapes[key] = update_shape(
                self.shapes.get(key), held, AttemptOutcome.SUCCEEDED, None
            )
            job = attempt.job
            self.completed.append(
                CompletedRun(job.config, job.task, s.level, now_s - attempt.start_s)
            )
            self.durations.add(self.completed[-1])  # not rebuilt from every run: O(1)
            return
        self.shapes[key] = update_shape(
            self.shapes.get(key), held, AttemptOutcome.OOM, held, int(s.predicted_mib) or None
        )
        decision = retry_decision(AttemptOutcome.OOM, "CUDA out of memory", self.attempts[s.job_index],
                                  TRACE_LEVELS, s.level)
        if decision.action == "requeue" and decision.level is not None:
            self._enqueue(s.job_index, decision.level.index, now_s)

    def _enqueue(self, j: int, level: int, now_s: float) -> None:
        self.queue[j] = _Queued(level, now_s)
        self.by_shape.add(j, self.shape_of(self.trace.jobs[j], level), j)
        heapq.heappush(self._wakes, (now_s + self.packing.starvation_s, j))

    def next_wake_s(self, sim: Simulator, now_s: float) -> float | None:
        """When the next queued job crosses the starvation threshold (pack's answer may change)."""
        # a heap of (threshold, job): entries past, of jobs that left, or superseded are dropped
        while self._wakes and (
            self._wakes[0][0] <= now_s
            or self._wakes[0][1] not in self.queue
            or self.queue[self._wakes[0][1]].since_s + self.packing.starvation_s != self._wakes[0][0]
        ):
            heapq.heappop(self._wakes)
        wake = self._wakes[0][0] if self._wakes else None
        if self.packing.overlap and self.startups and self.queue:
            # a queued job may start ahead once a running attempt's end is within its start-up
            leads = {s for s, _ in self.startups.values()}
            ahead = [end - lead for a in sim.running if (end := self._expected_end_s(a)) is not None
                     for lead in leads if end - lead > now_s + 1e-6]
            wake = min([w for w in (wake, *ahead) if w is not None], default=None)
        return wake

    def finished(self) -> bool:
        return not self.queue
