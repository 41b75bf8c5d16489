"""When a peak becomes known, and how far orch is from an oracle.

`python -m benchmarks.packing.learning [--trace FILE]... [--minutes-scale 1,10] [--json]`

The policies are in daemon_policy (the daemon's, the oracle) and family_policy. Every shipped trace
is LoRA fine-tuning jobs (GLA-1.3B on E5; 0.5B-3B models on the generated ones), for which the
daemon has its calibrated memory estimate; the trace carries no configs, so the estimate is modelled
(StepKPolicy.estimate). Rows:
- `orch` (the daemon on these traces): the real `pack` with the daemon's defaults; a shape's
  peak counts once a running attempt of it has run K optimizer steps (`known_after_s` after its
  memory ramp, at `early_fraction` of its true peak, with the running margin) and its
  completion replaces it; before that, the model of the LoRA estimate once a job of the same
  model and task has succeeded, else the declared figure; the first queued job of each model
  and task not yet taught counts as longest (orchestrator.scheduling.teaching, as in the daemon).
- `orch no-carry`, `declared no-carry`: those rows without OOM evidence carried across ladder rungs
  and without start where it fits (orchestrator.prediction.carried): the daemon before them;
- diagnostics, each `orch` with one thing changed: `orch nohold` (no starvation hold: what the
  hold costs), `orch best_fit` (best-fit placement instead of spread), `orch durations` (every
  run time known up front, at every ladder level: what learning run times costs), `orch dur
  nosooner` and `orch nosooner` (`orch durations` and `orch` without a later exact level where it
  ends sooner: what that rule does; it needs a rung's slowdown, which `orch` learns only where a
  config and task finished at two levels), `orch peaks` (every true peak + 5 % known up front: what
  predicting costs);
- `declared step-k`: `orch` without the estimate (declared figures, learning at step K): the
  daemon for jobs it cannot estimate (not LoRA, or an unknown model); `declared end` learns a
  peak only when an attempt completes (the daemon before provisional peaks); `declared nohold`
  is `declared step-k` without the starvation hold;
- `family`: the daemon on a foreign script's sweep (declared figures, memory families, probing;
  benchmarks.packing.family_policy); `family no-across` predicts a member on a task its family has
  not run by the family's largest peak, not by how the tasks compare in other families of the
  model (the daemon before that rule); `family noprobe` does not probe;
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
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.packing.daemon_policy import (
    EARLY_FRACTION,
    KNOWN_AFTER_S,
    KnownDurationsPolicy,
    KnownPeaksPolicy,
    OraclePolicy,
    StepKPolicy,
    daemon,
)
from benchmarks.packing.family_policy import FamilyPolicy
from benchmarks.packing.policies import OrchPolicy
from benchmarks.packing.simulator import SimResult, Simulator, lower_bound_min
from benchmarks.packing.trace import Trace, TraceJob, load_trace
from orchestrator.scheduling.packing.types import PackingPolicy

TRACES = ("e5_glue_7x24.yaml", "mixed_5gpu.yaml", "foreign_4x48.yaml", "late_oom_4x48.yaml")
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


def no_sooner(policy: StepKPolicy) -> StepKPolicy:
    """The policy without a later exact level where it ends sooner (QueuedJob.alternatives)."""
    policy.sooner_levels = False
    return policy


def compare(trace: Trace, known_after_s: float, early_fraction: float) -> list[dict[str, object]]:
    bound = lower_bound_min(trace)
    work = sum(j.minutes[0] for j in trace.jobs)
    oracle = Simulator(trace).run(OraclePolicy(trace))
    def step_k(cls: type[StepKPolicy], name: str, packing: PackingPolicy | None = None,
               estimate: bool = True) -> StepKPolicy:
        return cls(trace, packing=packing or PackingPolicy(), name=name, known_after_s=known_after_s,
                   early_fraction=early_fraction, estimate=estimate)

    runs: list[OrchPolicy] = [
        daemon(trace, known_after_s=known_after_s, early_fraction=early_fraction),
        step_k(StepKPolicy, "orch nohold", PackingPolicy(starvation_s=1e12)),
        step_k(StepKPolicy, "orch best_fit", PackingPolicy(placement="best_fit")),
        step_k(KnownDurationsPolicy, "orch durations"),
        no_sooner(step_k(KnownDurationsPolicy, "orch dur nosooner")),
        no_sooner(daemon(trace, name="orch nosooner", known_after_s=known_after_s, early_fraction=early_fraction)),
        step_k(KnownPeaksPolicy, "orch peaks"),
        daemon(trace, name="orch no-carry", known_after_s=known_after_s, early_fraction=early_fraction,
               carry=False),
        step_k(StepKPolicy, "declared step-k", estimate=False),
        StepKPolicy(trace, packing=PackingPolicy(), name="declared no-carry", known_after_s=known_after_s,
                    early_fraction=early_fraction, estimate=False, carry=False),
        OrchPolicy(trace, name="declared end"),
        step_k(StepKPolicy, "declared nohold", PackingPolicy(starvation_s=1e12), estimate=False),
    ]
    runs += [
        step_k(FamilyPolicy, "family", estimate=False),
        FamilyPolicy(trace, name="family no-across", known_after_s=known_after_s, early_fraction=early_fraction,
                     across=False),
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
    parser.add_argument("--known-after-s", type=float, default=KNOWN_AFTER_S, help="ramp end to step K, seconds")
    parser.add_argument("--early-fraction", type=float, default=EARLY_FRACTION, help="peak seen by step K / true peak")
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
