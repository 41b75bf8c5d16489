"""When a peak becomes known, and how far orch is from an oracle.

`python -m benchmarks.packing.learning [--trace FILE]... [--minutes-scale 1,10] [--json]`

Every shipped trace is LoRA fine-tuning jobs (GLA-1.3B on E5; 0.5B-3B models on the generated
ones), for which the daemon has its calibrated memory estimate; the trace carries no configs, so
the estimate is modelled (StepKPolicy.estimate). Rows:
- `orch` (the daemon on these traces): the real `pack` with the daemon's defaults; a shape's
  peak counts once a running attempt of it has run K optimizer steps (`known_after_s` after its
  memory ramp, at `early_fraction` of its true peak, with the running margin) and its
  completion replaces it; before that, the model of the LoRA estimate once a job of the same
  model and task has succeeded, else the declared figure; the first queued job of each model
  and task not yet taught counts as longest (orchestrator.scheduling.teaching, as in the daemon).
- diagnostics, each `orch` with one thing changed: `orch nohold` (no starvation hold: what the
  hold costs), `orch best_fit` (best-fit placement instead of spread), `orch durations` (every
  run time known up front: what learning run times costs), `orch peaks` (every true peak + 5 %
  known up front: what predicting costs);
- `declared step-k`: `orch` without the estimate (declared figures, learning at step K): the
  daemon for jobs it cannot estimate (not LoRA, or an unknown model); `declared end` learns a
  peak only when an attempt completes (the daemon before provisional peaks); `declared nohold`
  is `declared step-k` without the starvation hold;
- `oracle`: offline, knows every job's true peak and solo duration, picks the fastest level
  that fits a card and list-schedules longest run first through the same `pack` (no headroom,
  no learning); `oracle+hdrm` the same with orch's headroom (what the headroom alone costs).
Each trace is run as shipped and with every job's minutes × each `--minutes-scale` (long jobs:
the first wave then lasts hours, which is where learning early pays).
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.packing.policies import OrchPolicy
from benchmarks.packing.simulator import (
    Attempt,
    Outcome,
    SimResult,
    Simulator,
    Start,
    best_level,
    lower_bound_min,
)
from benchmarks.packing.trace import RUN_ALONE_LEVEL, Trace, TraceJob, load_trace
from orchestrator.prediction.memory import Prediction, predict_peak_mib
from orchestrator.prediction.shapes import PROVISIONAL_STEPS, RunningPeak, fold_running
from orchestrator.scheduling.packing.pack import pack
from orchestrator.scheduling.packing.types import GpuState, PackingPolicy, QueuedJob, RunningAttempt
from orchestrator.store.peak_source import PredictionSource, SourceKind

TRACES = ("e5_glue_7x24.yaml", "mixed_5gpu.yaml", "foreign_4x48.yaml", "late_oom_4x48.yaml")
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

    def __post_init__(self) -> None:
        self.queue = {j: best_level(job, self.trace) for j, job in enumerate(self.trace.jobs)}
        if self.headroom:
            self.packing = PackingPolicy(starvation_s=1e12, order="longest_run_first")
        else:
            self.packing = PackingPolicy(headroom_fraction=0.0001, headroom_max_mib=None, starvation_s=1e12,
                                         order="longest_run_first")

    def decide(self, sim: Simulator, now_s: float) -> list[Start]:
        if not self.queue:
            return []
        gpus = [
            GpuState(g.index, f"sim-{g.index}", int(g.total_mib), int(sim.free_mib(g.index, now_s)), n)
            for g, n in zip(self.trace.gpus, self.trace.plan, strict=True)
        ]
        running = [
            RunningAttempt(a.start.job_index, a.start.gpu_index, int(a.peak_mib) + 1, int(a.held_mib(now_s)),
                           reached_peak=not a.ramping(now_s), run_alone=a.start.run_alone)
            for a in sim.running
        ]
        queue = [
            QueuedJob(j, 0, j, int(self.trace.jobs[j].peak_mib[lv]) + 1, 0.0,
                      run_alone=lv == RUN_ALONE_LEVEL, expected_duration_s=self.trace.jobs[j].minutes[lv] * 60)
            for j, lv in self.queue.items()
        ]
        starts = []
        for p in pack(queue, gpus, running, self.packing, now_s).placements:
            level = self.queue.pop(p.job_id)
            starts.append(Start(p.job_id, p.gpu_index, level, p.reserved_mib, level == RUN_ALONE_LEVEL))
        return starts

    def on_end(self, sim: Simulator, attempt: Attempt, outcome: Outcome, now_s: float) -> None:
        if outcome == "oom":  # cannot happen with true peaks; retried alone if it ever does
            self.queue[attempt.start.job_index] = RUN_ALONE_LEVEL

    def next_wake_s(self, sim: Simulator, now_s: float) -> float | None:
        return None

    def finished(self) -> bool:
        return not self.queue


@dataclass
class KnownDurationsPolicy(StepKPolicy):
    """`orch step-k` told every job's true run time up front: what learning run times costs."""

    name: str = "orch durations"

    def expected_s(self, job_index: int, level: int) -> float | None:
        return self.trace.jobs[job_index].minutes[level] * 60.0


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


def scaled(trace: Trace, factor: float) -> Trace:
    def job(j: TraceJob) -> TraceJob:
        return replace(j, minutes=tuple(m * factor for m in j.minutes))

    return replace(trace, jobs=tuple(job(j) for j in trace.jobs))


def row(name: str, r: SimResult, bound: float, oracle_min: float, work_min: float) -> dict[str, object]:
    return {
        "policy": name,
        "makespan_min": round(r.makespan_min, 1),
        "vs_bound": round(r.makespan_min / bound, 3),
        "vs_oracle": round(r.makespan_min / oracle_min, 3),
        "oom_events": r.oom_events,
        "oom_lost_gpu_min": round(r.oom_lost_gpu_min, 1),
        "oom_lost_pct": round(100 * r.oom_lost_gpu_min / work_min, 2),
        "failed_jobs": r.failed_jobs,
    }


def compare(trace: Trace, known_after_s: float, early_fraction: float) -> list[dict[str, object]]:
    bound = lower_bound_min(trace)
    work = sum(j.minutes[0] for j in trace.jobs)
    oracle = Simulator(trace).run(OraclePolicy(trace))
    def step_k(cls: type[StepKPolicy], name: str, packing: PackingPolicy | None = None,
               estimate: bool = True) -> StepKPolicy:
        return cls(trace, packing=packing or PackingPolicy(), name=name, known_after_s=known_after_s,
                   early_fraction=early_fraction, estimate=estimate)

    runs: list[OrchPolicy] = [
        step_k(StepKPolicy, "orch"),
        step_k(StepKPolicy, "orch nohold", PackingPolicy(starvation_s=1e12)),
        step_k(StepKPolicy, "orch best_fit", PackingPolicy(placement="best_fit")),
        step_k(KnownDurationsPolicy, "orch durations"),
        step_k(KnownPeaksPolicy, "orch peaks"),
        step_k(StepKPolicy, "declared step-k", estimate=False),
        OrchPolicy(trace, name="declared end"),
        step_k(StepKPolicy, "declared nohold", PackingPolicy(starvation_s=1e12), estimate=False),
    ]
    from benchmarks.packing.family_policy import FamilyPolicy  # it builds on StepKPolicy, above

    runs += [
        step_k(FamilyPolicy, "family", estimate=False),
        FamilyPolicy(trace, name="family noprobe", known_after_s=known_after_s, early_fraction=early_fraction,
                     probing=False),
    ]
    rows = [row(p.name, Simulator(trace).run(p), bound, oracle.makespan_min, work) for p in runs]
    # the same, with every attempt after a death resuming from the last checkpoint (every 10 % of the work)
    resumed = [step_k(StepKPolicy, "orch resume"), step_k(FamilyPolicy, "family resume", estimate=False)]
    rows += [row(p.name, Simulator(trace, resume=True).run(p), bound, oracle.makespan_min, work) for p in resumed]
    rows.append(row("oracle", oracle, bound, oracle.makespan_min, work))
    rows.append(row("oracle+hdrm", Simulator(trace).run(OraclePolicy(trace, headroom=True)), bound,
                    oracle.makespan_min, work))
    return rows


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parents[1] / "traces"
    parser = argparse.ArgumentParser(prog="python -m benchmarks.packing.learning", description=__doc__.splitlines()[0])
    parser.add_argument("--trace", action="append", help="trace YAML (default: the shipped traces)")
    parser.add_argument("--minutes-scale", default="1,10", help="comma-separated factors on every job's minutes")
    parser.add_argument("--known-after-s", type=float, default=30.0, help="ramp end to step K, seconds")
    parser.add_argument("--early-fraction", type=float, default=0.97, help="peak seen by step K / true peak")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        factors = [float(f) for f in args.minutes_scale.split(",") if f]
        traces = [(Path(t).name, load_trace(t)) for t in (args.trace or [here / n for n in TRACES])]
    except (OSError, ValueError, KeyError) as exc:
        print(f"invalid input: {exc}", file=sys.stderr)
        return 2
    results: list[dict[str, Any]] = []
    for name, trace in traces:
        for factor in factors:
            rows = compare(scaled(trace, factor), args.known_after_s, args.early_fraction)
            results.append({"trace": name, "minutes_scale": factor, "rows": rows})
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'trace':<22}{'×min':>5}  {'policy':<17}{'makespan':>10}{'/bound':>8}{'/oracle':>9}"
          f"{'OOMs':>6}{'lost GPU-min':>14}{'lost %':>8}{'failed':>8}")
    for r in results:
        for p in r["rows"]:
            print(f"{r['trace']:<22}{r['minutes_scale']:>5g}  {p['policy']:<17}{p['makespan_min']:>10.1f}"
                  f"{p['vs_bound']:>8.3f}{p['vs_oracle']:>9.3f}{p['oom_events']:>6}{p['oom_lost_gpu_min']:>14.1f}"
                  f"{p['oom_lost_pct']:>8.2f}{p['failed_jobs']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
