"""Start-up overlap through the daemon on a simulated card, modelled on the scarce TRL sweep (no GPU).

`python -m benchmarks.overlap_sim [--modes serial,plan,overlap] [--time-scale 0.5] [--out FILE]`

The sweep of `benchmarks/gpu/trl_sweep.py --case scarce` as the sim worker plays it: b256 and
b128 × 3 seeds on one 24 GiB card, each job holding its start-up hold (516 MiB) through its
start-up, then its peak through its steps and its exit (b256 13,866 MiB, the true peak on an
H200; b128 at half the activations, 7,191 MiB against a true 7,948, so that the two share one
memory family through `gradient_accumulation_steps` as the TRL configs do), with the H200's
times (start-up 25 s, 33 s of steps, 3 s from the last step to exit; `--time-scale` scales
them). Declared 3 GiB, headroom 10 % (at most 2.4 GiB), as trl_sweep runs the daemon. Modes:
`serial` (plan 1), `plan` (plan 4), `overlap` (plan 4, `--overlap`). Per mode: the makespan,
attempts, OOM'd attempts, every attempt's start and end, and the start-ups orch learned. It runs
the real daemon, tmux and state.db; only the memory is simulated, and a sim job's pace does not
slow when it shares the card.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.gpu.sweep_common import (
    end_sweep,
    fresh_tag_dir,
    orch,
    start_daemon,
    use_sim_gpus,
    watch_sweep,
)
from orchestrator.store.db import Store
from orchestrator.store.startups import read_startups

# config -> (per-device batch, accumulation): one effective batch of 256, as trl_sweep's scarce case
CONFIGS = {"b256": (256, 1), "b128": (128, 2)}
PEAK_MIB = 13_866  # b256's true peak on an H200 (trl_sweep, one job at a time)
HOLD_MIB = 516  # what orch learned a TRL job holds before its first step (H200)
STARTUP_S, STEPS_S, EXIT_S = 25.0, 33.0, 3.0  # the H200's, one job at a time
SEEDS = 3
CARD = "1x24GiB"
MODES = {"serial": ("1", []), "plan": ("4", []), "overlap": ("4", ["--overlap"])}


def write_plans(plans: Path, scale: float) -> None:
    (plans / "suites").mkdir(parents=True, exist_ok=True)
    (plans / "configs" / "trl").mkdir(parents=True, exist_ok=True)
    for name, (batch, accumulation) in CONFIGS.items():
        config = {"batch_size": batch, "gradient_accumulation_steps": accumulation, "sim_mem_gib": PEAK_MIB / 1024,
                  "sim_base_gib": HOLD_MIB / 1024, "sim_startup_s": STARTUP_S * scale,
                  "sim_seconds": STEPS_S * scale, "sim_ramp_s": 0.5, "sim_exit_s": EXIT_S * scale}  # fmt: skip
        (plans / "configs" / "trl" / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    suite = {"worker": "sim", "mem_gib": 3, "max_attempts": 6, "hang_timeout_s": 120, "min_stack_gain": 0.1,
             "ladder": [{"halve_batch": True}], "configs": list(CONFIGS)}  # fmt: skip
    (plans / "suites" / "trl.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))


def read_run(db: Path, tag_dir: Path) -> dict[str, Any]:
    """The sweep's figures from its dumps (`orch show --json` of each job) and its learned start-ups."""
    attempts = []
    for path in sorted((tag_dir / "dumps" / "show").glob("*.json"), key=lambda p: int(p.stem)):
        job = json.loads(path.read_text())
        attempts += [{"job": job["id"], "config": job["config"], "n": a["n"], "outcome": a["outcome"],
                      "level": a["level"], "started_at": a["started_at"], "ended_at": a["ended_at"]}
                     for a in job["attempts"]]  # fmt: skip
    t0 = min(a["started_at"] for a in attempts)
    for a in attempts:
        a["start_s"], a["end_s"] = round(a.pop("started_at") - t0, 1), round((a.pop("ended_at") or t0) - t0, 1)
    with Store(db) as store:
        startups = read_startups(store)
    return {
        "makespan_s": max(a["end_s"] for a in attempts),
        "attempts": len(attempts),
        "oom": sum(a["outcome"] == "oom" for a in attempts),
        "startups": [{"key": key, "seconds": round(s.seconds, 1), "held_mib": s.held_mib, "samples": s.samples}
                     for key, s in sorted(startups.items())],
        "timeline": sorted(attempts, key=lambda a: a["start_s"]),
    }


def run_mode(mode: str, work: Path, scale: float, budget_s: float) -> dict[str, Any]:
    plan, options = MODES[mode]
    tag_dir, db = fresh_tag_dir(work, work / "out", mode)
    use_sim_gpus(tag_dir, CARD)
    plans = tag_dir / "plans"
    write_plans(plans, scale)
    meta: dict[str, Any] = {"mode": mode}
    daemon = None
    try:
        pairs = ",".join(f"{seed}:toy" for seed in range(1, SEEDS + 1))
        orch(["submit", "--suite", "trl", "--pairs", pairs, "--gpu-plan", plan], db, plans)
        daemon = start_daemon(db, ["--backend", "sim", "--poll", "0.5", "--headroom", "0.1",
                                   "--headroom-max-gib", "2.4", *options])  # fmt: skip
        watch_sweep(db, daemon, tag_dir / "frames", meta, budget_s, 30.0)
    finally:
        end_sweep(db, tag_dir, meta, daemon, None)
    return {**read_run(db, tag_dir), **({"incomplete": meta["incomplete"]} if "incomplete" in meta else {})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.overlap_sim", description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default="serial,plan,overlap")
    parser.add_argument("--time-scale", type=float, default=0.5, help="shortens every time (default 0.5)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/orch-overlap-sim"))
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    parser.add_argument("--budget-s", type=float, default=900.0)
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not 0 < args.time_scale <= 4:
        parser.error(f"--modes from {', '.join(MODES)}; --time-scale in (0, 4]")
    figures: dict[str, Any] = {"time_scale": args.time_scale, "card": CARD, "modes": {}}
    for mode in modes:
        began = time.monotonic()
        figures["modes"][mode] = found = run_mode(mode, args.work, args.time_scale, args.budget_s)
        print(f"{mode}: makespan {found['makespan_s']:.1f} s, {found['attempts']} attempts, {found['oom']} OOM'd "
              f"({time.monotonic() - began:.0f} s wall); start-ups {found['startups']}", flush=True)
    serial = figures["modes"].get("serial", {}).get("makespan_s")
    for mode, found in figures["modes"].items():
        if serial and mode != "serial":
            print(f"{mode}: {serial / found['makespan_s']:.2f}x one job at a time", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", "160")
    sys.exit(main())
