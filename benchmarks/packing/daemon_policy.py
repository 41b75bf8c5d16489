"""The daemon's own policy in the packing simulator, and the offline oracle it is raced against.

`StepKPolicy` is `orch` as the daemon runs it: the real `pack` at the daemon's defaults, a
shape's peak learned once a running attempt of it has run K optimizer steps (`known_after_s`
after its memory ramp, at `early_fraction` of its true peak, with the running margin) and
replaced by its completion; with `estimate`, a model of the daemon's LoRA estimate. `daemon`
builds it exactly as both `python -m benchmarks.packing` and `python -m benchmarks.packing.learning`
race it, so their `orch` rows are one number. `OraclePolicy` knows every true peak and solo
duration. The memory-family rules for foreign scripts are in family_policy, which builds on this.
"""

from __future__ import annotations

import zlib
from collections.abc import Hashable
from dataclasses import dataclass, field

from benchmarks.packing.policies import OrchPolicy
from benchmarks.packing.simulator import Attempt, Outcome, Simulator, Start, best_level
from benchmarks.packing.trace import RUN_ALONE_LEVEL, Trace
from orchestrator.prediction.memory import Prediction, predict_peak_mib
from orchestrator.prediction.shapes import PROVISIONAL_STEPS, RunningPeak, fold_running
from orchestrator.scheduling.packing.pack import pack
from orchestrator.scheduling.packing.types import GpuState, PackingPolicy, QueuedJob, RunningAttempt
from orchestrator.store.peak_source import PredictionSource, SourceKind

ESTIMATE_MAX_ERROR = 0.095  # the calibrated estimate's largest error over the measured rows


def model_of(config: str) -> str:
    """The model a trace config runs: generated traces name configs `<model>_lora_cfgN`; the E5
    trace's configs (no `_lora`) all run GLA-1.3B."""
    return config.split("_lora", 1)[0] if "_lora" in config else ""


@dataclass
class StepKPolicy(OrchPolicy):
    """`orch` whose shapes also learn from running attempts past step K."""

    known_after_s: float = 30.0  # from the end of the memory ramp to step K
    early_fraction: float = 0.97  # share of the true peak an attempt has reached by step K
    name: str = "orch step-k"
    running: dict[tuple[str, str, int], RunningPeak] = field(default_factory=dict)
    held: dict[tuple[str, str, int], RunningPeak] = field(default_factory=dict)  # before step K: floors
    # Model the daemon's LoRA estimate, which trace jobs (no configs) lack: once a job of the same
    # model and task has succeeded (its result reports the longest prompt), later jobs of that
    # model and task are estimated at their true peak times (1 + e), e fixed per (config, task,
    # level) and spread evenly over ±ESTIMATE_MAX_ERROR (`python -m benchmarks.memory_fit`).
    # Before that: the declared figure (the daemon's estimate at max_seq_len needs the config).
    estimate: bool = False
    tasks_done: set[tuple[str, str]] = field(default_factory=set)

    def _refresh(self, sim: Simulator, now_s: float) -> None:
        passed = [
            (self.shape_of(a.job, a.start.level), int(a.peak_mib * self.early_fraction), PROVISIONAL_STEPS)
            for a in sim.running
            if now_s >= a.ramp_end_s + self.known_after_s
        ]
        self.running = fold_running(passed)
        self.held = fold_running(
            (self.shape_of(a.job, a.start.level), int(a.held_mib(now_s)), 0)
            for a in sim.running
            if now_s < a.ramp_end_s + self.known_after_s and a.held_mib(now_s) > 0
        )

    def predict(self, job_index: int, level: int) -> Prediction:
        job = self.trace.jobs[job_index]
        key = self.shape_of(job, level)
        estimate = None
        if self.estimate and (model_of(job.config), job.task) in self.tasks_done:
            spread = (zlib.crc32(repr(key).encode()) % 1001) / 500.0 - 1.0  # in [-1, 1]
            estimate = int(job.peak_mib[level] * (1 + ESTIMATE_MAX_ERROR * spread))
        return predict_peak_mib(
            self.shapes.get(key), estimate, int(job.declared_mib), self.margin, running=self.running.get(key),
            held=self.held.get(key),
        )

    def group(self, job_index: int, level: int) -> Hashable | None:
        """With the estimate, a finished run teaches every job of its model and data (their
        prompt lengths: the daemon's `prompt_length_key`)."""
        job = self.trace.jobs[job_index]
        return (model_of(job.config), job.task) if self.estimate else None

    def length_learned(self, job_index: int) -> bool:
        job = self.trace.jobs[job_index]
        return (model_of(job.config), job.task) in self.tasks_done

    def on_end(self, sim: Simulator, attempt: Attempt, outcome: Outcome, now_s: float) -> None:
        if outcome == "succeeded":
            self.tasks_done.add((model_of(attempt.job.config), attempt.job.task))
        super().on_end(sim, attempt, outcome, now_s)

    def decide(self, sim: Simulator, now_s: float) -> list[Start]:
        self._refresh(sim, now_s)
        return super().decide(sim, now_s)

    def next_wake_s(self, sim: Simulator, now_s: float) -> float | None:
        times = [t for t in [super().next_wake_s(sim, now_s)] if t is not None]
        times += [
            a.ramp_end_s + self.known_after_s
            for a in sim.running
            if a.ramp_end_s + self.known_after_s > now_s
        ]
        return min(times) if times else None


@dataclass
class OraclePolicy:
    """Offline: true peaks and durations, fastest fitting level, longest first, no headroom."""

    trace: Trace
    name: str = "oracle"
    queue: dict[int, int] = field(default_factory=dict)  # job -> level
    headroom: bool = False  # keep orch's headroom (10 %, at most 4 GiB): its share of the gap
    overlap: bool = False  # start a job its true start-up ahead of the true end that makes room

    def __post_init__(self) -> None:
        self.queue = {j: best_level(job, self.trace) for j, job in enumerate(self.trace.jobs)}
        if self.headroom:
            self.packing = PackingPolicy(starvation_s=1e12, order="longest_run_first", overlap=self.overlap)
        else:
            self.packing = PackingPolicy(headroom_fraction=0.0001, headroom_max_mib=None, starvation_s=1e12,
                                         order="longest_run_first", overlap=self.overlap)

    def decide(self, sim: Simulator, now_s: float) -> list[Start]:
        if not self.queue:
            return []
        gpus = [
            GpuState(g.index, f"sim-{g.index}", int(g.total_mib), int(sim.free_mib(g.index, now_s)), n)
            for g, n in zip(self.trace.gpus, self.trace.plan, strict=True)
        ]
        running = [
            RunningAttempt(a.start.job_index, a.start.gpu_index, int(a.peak_mib) + 1, int(a.held_mib(now_s)),
                           reached_peak=not (a.ramping(now_s) or a.starting(now_s)), run_alone=a.start.run_alone,
                           expected_end_s=self._end_s(sim, a, now_s) if self.overlap else None)
            for a in sim.running
        ]
        queue = [
            QueuedJob(j, 0, j, int(job.peak_mib[lv]) + 1, 0.0, run_alone=lv == RUN_ALONE_LEVEL,
                      expected_duration_s=job.minutes[lv] * 60 + job.startup_s,
                      ahead_s=job.startup_s if self.overlap else None, startup_mib=int(job.startup_mib) + 1)
            for j, lv in self.queue.items() for job in [self.trace.jobs[j]]
        ]
        starts = []
        for p in pack(queue, gpus, running, self.packing, now_s).placements:
            level = self.queue.pop(p.job_id)
            starts.append(Start(p.job_id, p.gpu_index, level, p.reserved_mib, level == RUN_ALONE_LEVEL))
        return starts

    @staticmethod
    def _end_s(sim: Simulator, attempt: Attempt, now_s: float) -> float:
        """When it ends if the card's sharing stays as it is now (what an oracle may know)."""
        k = max(1, sum(1 for a in sim.on_gpu(attempt.start.gpu_index) if not a.starting(now_s)))
        rate = sim.sharing[min(k, len(sim.sharing) - 1)] / k
        return max(now_s, attempt.startup_end_s) + attempt.remaining_min * 60.0 / rate

    def on_end(self, sim: Simulator, attempt: Attempt, outcome: Outcome, now_s: float) -> None:
        if outcome == "oom":  # cannot happen with true peaks; retried alone if it ever does
            self.queue[attempt.start.job_index] = RUN_ALONE_LEVEL

    def next_wake_s(self, sim: Simulator, now_s: float) -> float | None:
        if not self.overlap or not self.queue:
            return None
        leads = {self.trace.jobs[j].startup_s for j in self.queue}
        ahead = [end - lead for a in sim.running for end in [self._end_s(sim, a, now_s)] for lead in leads
                 if end - lead > now_s + 1e-6]
        return min(ahead, default=None)

    def finished(self) -> bool:
        return not self.queue


@dataclass
class KnownDurationsPolicy(StepKPolicy):
    """`orch step-k` told every job's true run time up front: what learning run times costs."""

    name: str = "orch durations"

    def expected_s(self, job_index: int, level: int) -> float | None:
        return self.trace.jobs[job_index].minutes[level] * 60.0

    def expected_at_level_s(self, job_index: int, level: int, from_level: int) -> float | None:
        return self.expected_s(job_index, level)


@dataclass
class KnownPeaksPolicy(StepKPolicy):
    """`orch step-k` told every job's true peak (plus the measured margin) up front: what
    predicting from declared figures and learning costs."""

    name: str = "orch peaks"

    def predict(self, job_index: int, level: int) -> Prediction:
        peak_mib = self.trace.jobs[job_index].peak_mib[level] * (1 + self.margin)
        return Prediction(int(peak_mib), PredictionSource(SourceKind.MEASURED))


@dataclass
class EstimatePolicy(StepKPolicy):
    """`orch step-k` with a model of the daemon's LoRA estimate (see StepKPolicy.estimate)."""

    name: str = "orch"
    estimate: bool = True


KNOWN_AFTER_S = 30.0  # from the end of a memory ramp to step K
EARLY_FRACTION = 0.97  # share of the true peak an attempt has reached by step K


def daemon(trace: Trace, packing: PackingPolicy | None = None, name: str = "orch",
           known_after_s: float = KNOWN_AFTER_S, early_fraction: float = EARLY_FRACTION,
           carry: bool = True) -> StepKPolicy:
    """The daemon's policy as every packing benchmark races it (its `orch` row); `carry=False`:
    without OOM evidence carried across rungs nor start where it fits (`orch no-carry`)."""
    return StepKPolicy(trace, packing=packing or PackingPolicy(), name=name, known_after_s=known_after_s,
                       early_fraction=early_fraction, estimate=True, carry=carry)
