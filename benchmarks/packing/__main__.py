"""`python -m benchmarks.packing --trace FILE [--json]`: race the launchers over one trace.

`orch` is the daemon's own policy (benchmarks.packing.daemon_policy.daemon: the real `pack`,
peaks learned at step K and at the end, the LoRA estimate's model), the same number as the `orch`
row of `python -m benchmarks.packing.learning`; `family` is the daemon on a foreign script's
sweep (declared figures, memory families); `oracle` knows every true peak and duration."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace

from benchmarks.packing.daemon_policy import OraclePolicy, daemon
from benchmarks.packing.family_policy import FamilyPolicy
from benchmarks.packing.launchers import RoundsPolicy, SlotsPolicy
from benchmarks.packing.simulator import (
    SHARING_THROUGHPUT,
    Policy,
    SimResult,
    Simulator,
    lower_bound_min,
    with_mps,
)
from benchmarks.packing.trace import Trace, load_trace
from orchestrator.scheduling.packing.types import PackingPolicy

POLICY_NAMES = ("rounds", "rounds+rerun", "slots", "threshold", "orch", "orch no-carry", "family", "oracle",
                "orch overlap", "family overlap", "oracle overlap", "orch mps", "oracle mps")
MPS_ROWS = ("orch mps", "oracle mps")  # raced with T(k) times the measured MPS gain


def make_policy(name: str, trace: Trace, packing: PackingPolicy) -> Policy:
    makers: dict[str, Callable[[], Policy]] = {
        "rounds": lambda: RoundsPolicy(trace),
        "rounds+rerun": lambda: RoundsPolicy(trace, rerun=True),
        "slots": lambda: SlotsPolicy(trace),
        "threshold": lambda: SlotsPolicy(trace, threshold=True),
        "orch": lambda: daemon(trace, packing),
        "orch no-carry": lambda: daemon(trace, packing, name="orch no-carry", carry=False),
        "family": lambda: FamilyPolicy(trace, packing=packing, name="family"),
        "oracle": lambda: OraclePolicy(trace),
        "orch overlap": lambda: daemon(trace, replace(packing, overlap=True), name="orch overlap"),
        "family overlap": lambda: FamilyPolicy(trace, packing=replace(packing, overlap=True), name="family overlap"),
        "oracle overlap": lambda: OraclePolicy(trace, name="oracle overlap", overlap=True),
        "orch mps": lambda: daemon(trace, packing, name="orch mps"),
        "oracle mps": lambda: OraclePolicy(trace, name="oracle mps"),
    }
    return makers[name]()


def run_all(
    trace: Trace, packing: PackingPolicy, names: tuple[str, ...] = POLICY_NAMES
) -> dict[str, SimResult]:
    plain = trace.sharing or SHARING_THROUGHPUT
    return {
        name: Simulator(trace, with_mps(plain) if name in MPS_ROWS else plain).run(
            make_policy(name, trace, packing)
        )
        for name in names
    }


def report(trace: Trace, results: dict[str, SimResult]) -> dict[str, object]:
    bound = lower_bound_min(trace)
    oracle = results.get("oracle")
    return {
        "lower_bound_min": round(bound, 1),
        "total_work_min": round(sum(j.minutes[0] for j in trace.jobs), 1),
        "policies": {
            name: {
                "makespan_min": round(r.makespan_min, 1),
                "ratio": round(r.makespan_min / bound, 3),
                "vs_oracle": round(r.makespan_min / oracle.makespan_min, 3) if oracle else None,
                "oom_events": r.oom_events,
                "oom_lost_gpu_min": round(r.oom_lost_gpu_min, 1),
                "failed_jobs": r.failed_jobs,
                "mean_wait_min": round(r.mean_wait_min, 1),
            }
            for name, r in results.items()
        },
    }


def render(data: dict[str, object]) -> str:
    policies = data["policies"]
    assert isinstance(policies, dict)
    lines = [
        f"lower bound {data['lower_bound_min']} min",
        f"{'policy':<14}{'makespan':>10}{'ratio':>7}{'/oracle':>8}{'OOMs':>6}{'lost GPU-min':>14}{'failed':>8}"
        f"{'mean wait':>11}",
    ]
    for name, p in policies.items():
        vs_oracle = f"{p['vs_oracle']:>8.3f}" if p["vs_oracle"] is not None else f"{'-':>8}"
        lines.append(
            f"{name:<14}{p['makespan_min']:>10.1f}{p['ratio']:>7.3f}{vs_oracle}{p['oom_events']:>6}"
            f"{p['oom_lost_gpu_min']:>14.1f}{p['failed_jobs']:>8}{p['mean_wait_min']:>11.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.packing", description=__doc__)
    parser.add_argument("--trace", required=True, help="trace YAML (see benchmarks/README.md)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--headroom", type=float, default=PackingPolicy().headroom_fraction)
    parser.add_argument("--starvation-s", type=float, default=PackingPolicy().starvation_s)
    parser.add_argument(
        "--placement", choices=("spread", "best_fit"), default=PackingPolicy().placement
    )
    parser.add_argument(
        "--order", choices=("longest_first", "longest_run_first", "fifo"), default=PackingPolicy().order
    )
    parser.add_argument("--policies", default=",".join(POLICY_NAMES), help="comma-separated subset")
    args = parser.parse_args(argv)
    names = tuple(n for n in args.policies.split(",") if n)
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown:
        print(
            f"unknown policy {unknown[0]!r}; choose from {', '.join(POLICY_NAMES)}", file=sys.stderr
        )
        return 2
    try:
        trace = load_trace(args.trace)
    except (OSError, ValueError, KeyError) as e:
        print(f"cannot read trace {args.trace}: {e}", file=sys.stderr)
        return 2
    packing = PackingPolicy(
        headroom_fraction=args.headroom, starvation_s=args.starvation_s, placement=args.placement, order=args.order
    )
    data = report(trace, run_all(trace, packing, names))
    print(json.dumps(data, indent=2) if args.json else render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
