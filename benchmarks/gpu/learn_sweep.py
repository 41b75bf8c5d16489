"""A GPU sweep of minutes-long jobs whose declared memory is wrong both ways: does orch learn
each shape's peak from its first running attempt and pack the rest at the measured size?

    python benchmarks/gpu/learn_sweep.py --work /tmp/learn --out OUT --budget-s 390   # GPU, ~8 min
    python benchmarks/gpu/learn_sweep.py --dry --work /tmp/learn-dry --out /tmp/o --max-steps 120

Two suites on the Llama of 1.3B shape (LoRA r=8 q/k/v/o, toy GLUE data, <= 34 tokens) of
benchmarks/gpu/run_sweep.py: `over` declares 20 GiB for batch 16 (true peak about 4.6 GiB) and
`under` declares 8 GiB for batch 128 (true about 12.1 GiB). A ballast leaves `--leave-gib` (38)
free on the card, with a fixed headroom of 2.4 GiB. The sizes are chosen so that the second
`over` job cannot start at its declared 20 GiB beside the first wave (one job of each shape) but
fits at its measured size: it starts only once the first `over` attempt has passed step K.
Reported in OUT/learn-summary.json: for the first 10 minutes the time-averaged number of running
jobs against an oracle that knows every true peak (the jobs that fit the free memory and the
plan at once, taken from the queue in order, by the peaks measured in this very run); per shape
when its first attempt passed step K (from its `progress.jsonl`), the first start sized from a
running attempt (`measured (running, step N)`) and the delay between the two; per shape the
OOMs of attempts started after its first OOM had ended (the first wave's simultaneous OOMs are
the declared figure's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, on a GPU machine

from benchmarks.gpu.sweep_common import (
    REPO,
    end_sweep,
    exit_through_finally_on_sigterm,
    fresh_tag_dir,
    llama_1_3b,
    orch,
    pack_out,
    sample_rte,
    start_ballast,
    start_daemon,
    use_sim_gpus,
    watch_sweep,
)
from orchestrator.prediction.shapes import PROVISIONAL_STEPS

# declared GiB, {config: batch}; `over` first in queue order. On 38 GiB with 2.4 GiB headroom the
# first pass places one of each (20 + 8 GiB declared); a second `over` at 20 GiB never fits beside
# their true 16.7 GiB, at its measured ~5.3 GiB it does
SUITES = {"over": (20, {"small_b16": 16}), "under": (8, {"big_b128": 128})}
WINDOW_S = 600.0


# --dry: the sim worker holding the true peaks of the GPU run on a simulated card, so that the
# learning itself (not only the plumbing) runs here; 4 steps per second
SIM_PEAK_GIB = {"big_b128": 12.0, "small_b16": 4.5}


def write_plans(plans: Path, model: str, data_dir: Path, max_steps: int, sim: bool = False) -> None:
    peft = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM",
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}  # fmt: skip
    (plans / "suites").mkdir(parents=True, exist_ok=True)
    for suite, (mem_gib, configs) in SUITES.items():
        (plans / "configs" / suite).mkdir(parents=True, exist_ok=True)
        for name, batch in configs.items():
            config = {"model": model, "peft": peft, "data_dir": str(data_dir), "learning_rate": 3e-4,
                      "max_steps": max_steps, "prec": "bf16", "gradient_accumulation_steps": 1,
                      "gradient_checkpointing": False, "num_data_workers": 2, "max_seq_len": 256,
                      "no_save": True, "batch_size": batch}  # fmt: skip
            if sim:
                config = {"model": "sim-llama", "batch_size": batch, "learning_rate": 3e-4,
                          "gradient_accumulation_steps": 1, "gradient_checkpointing": False,
                          "sim_mem_gib": SIM_PEAK_GIB[name], "sim_seconds": max_steps / 4, "sim_ramp_s": 2}  # fmt: skip
            (plans / "configs" / suite / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        worker = "sim" if sim else f"{sys.executable} -m workers.lora --config {{config}} --run-dir {{run_dir}}"
        body = {"worker": worker,
                "mem_gib": mem_gib, "one_token_tasks": ["glue*"], "max_attempts": 8, "hang_timeout_s": 300,
                "env": {"PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO)), "ORCH_HEARTBEAT_S": "2",
                        **({"ORCH_WORKER_DEVICE": "cpu"} if model == "tiny-llama" else {})},
                "configs": list(configs)}  # fmt: skip
        (plans / "suites" / f"{suite}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))


def concurrency(attempts: list[dict[str, Any]], t0: float, t1: float) -> float:
    """Time-averaged number of live attempts over [t0, t1]."""
    if t1 <= t0:
        return 0.0
    total = 0.0
    for a in attempts:
        start, end = a["started_at"], a["ended_at"] or t1
        total += max(0.0, min(end, t1) - max(start, t0))
    return total / (t1 - t0)


def oracle_concurrency(jobs: list[dict[str, Any]], peaks: dict[str, int], free_mib: int, slots: int) -> int:
    """Jobs that fit at once by their true level-0 peak, in queue order, under the plan."""
    used, n = 0, 0
    for job in jobs:
        peak = peaks.get(f"{job['suite']}/{job['config']}")
        if peak is None or n >= slots:
            continue
        if used + peak <= free_mib:
            used, n = used + peak, n + 1
    return n


def _step_k_at(run_dir: str | None, k: int = PROVISIONAL_STEPS) -> float | None:
    """When an attempt's worker first reported step >= K (its progress.jsonl), or None."""
    if not run_dir:
        return None
    path = Path(run_dir) / "progress.jsonl"
    if not path.is_file():
        return None
    for line in path.read_text(errors="replace").splitlines():
        try:
            beat = json.loads(line)
        except ValueError:
            continue
        if isinstance(beat, dict) and isinstance(beat.get("step"), int) and beat["step"] >= k:
            return float(beat["t"])
    return None


def summarize(db_dir: Path, free_mib: int, slots: int, headroom_mib: int = 0) -> dict[str, Any]:
    jobs = [json.loads((db_dir / "dumps" / "show" / p.name).read_text())
            for p in sorted((db_dir / "dumps" / "show").glob("*.json"), key=lambda p: int(p.stem))]  # fmt: skip
    attempts = [
        {**a, "shape": f"{j['suite']}/{j['config']} L{a['level']}", "job": j["id"]}
        for j in jobs
        for a in j["attempts"]
    ]
    if not attempts:
        return {"error": "no attempts"}
    t0 = min(a["started_at"] for a in attempts)
    t1 = min(t0 + WINDOW_S, max(a["ended_at"] or a["started_at"] for a in attempts))
    peaks: dict[str, int] = {}
    for j in jobs:
        for a in j["attempts"]:
            # cancelled at the deadline after minutes of training: its peak is the shape's too
            if a["outcome"] in ("succeeded", "cancelled") and a["level"] == 0 and a["peak_mib"]:
                key = f"{j['suite']}/{j['config']}"
                peaks[key] = max(peaks.get(key, 0), a["peak_mib"])
    shapes: dict[str, Any] = {}
    for shape in sorted({a["shape"] for a in attempts}):
        mine = sorted((a for a in attempts if a["shape"] == shape), key=lambda a: a["started_at"])
        running = [a for a in mine if str(a["prediction_source"]).startswith("measured (running")]
        ooms = [a for a in mine if a["outcome"] == "oom"]
        first_oom_end = min((a["ended_at"] for a in ooms if a["ended_at"]), default=None)
        later = [a for a in ooms if first_oom_end is not None and a["started_at"] > first_oom_end]
        # an OOM of an attempt placed by a measurement (finished, running or a neighbour's) is
        # learning gone wrong, whenever it started; OOMs of declared/estimated starts are not
        measured_ooms = [a for a in ooms if str(a["prediction_source"]).startswith("measured")]
        step_k_at = _step_k_at(mine[0].get("run_dir"))
        shapes[shape] = {
            "attempts": len(mine), "ooms": len(ooms), "ooms_after_first": len(later),
            "ooms_of_measured_starts": len(measured_ooms),
            "first_running_sized_start_after_s": (
                round(running[0]["started_at"] - mine[0]["started_at"], 1) if running else None),
            "first_step_k_after_s": None if step_k_at is None else round(step_k_at - mine[0]["started_at"], 1),
            "running_sized_start_after_step_k_s": round(running[0]["started_at"] - step_k_at, 1)
            if running and step_k_at is not None else None,
            "running_sized_starts": [{"job": a["job"], "predicted_mib": a.get("predicted_peak_mib"),
                                      "source": a["prediction_source"], "outcome": a["outcome"],
                                      "peak_mib": a["peak_mib"]} for a in running],
            "sources": sorted({str(a["prediction_source"]) for a in mine}),
        }  # fmt: skip
    # once the last job has started, concurrency falls as jobs end whatever the policy: the
    # oracle's figure (how many fit at once) compares with the time while jobs still queued
    never_started = {j["id"] for j in jobs} - {a["job"] for a in attempts}
    queue_empty_at = t1 if never_started else min(t1, max(a["started_at"] for a in attempts))
    return {
        "window_s": round(t1 - t0, 1),
        "mean_concurrency": round(concurrency(attempts, t0, t1), 2),
        "queued_for_s": round(queue_empty_at - t0, 1),
        "mean_concurrency_while_queued": round(concurrency(attempts, t0, queue_empty_at), 2),
        "oracle_concurrency": oracle_concurrency(jobs, peaks, free_mib, slots),
        "oracle_concurrency_with_headroom": oracle_concurrency(jobs, peaks, free_mib - headroom_mib, slots),
        "true_peaks_mib": peaks,
        "ooms_after_first_per_shape": sum(s["ooms_after_first"] for s in shapes.values()),
        "ooms_of_measured_starts": sum(s["ooms_of_measured_starts"] for s in shapes.values()),
        "shapes": shapes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/orch-learn"))
    parser.add_argument("--out", type=Path, default=Path("learn-out"))
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=1200, help="a few minutes per job on an H200")
    parser.add_argument("--leave-gib", type=float, default=38.0)
    parser.add_argument("--gpu-plan", default="8")
    parser.add_argument(
        "--headroom",
        type=float,
        default=0.1,
        help="fraction of the card, capped by --headroom-max-gib",
    )
    parser.add_argument("--headroom-max-gib", type=float, default=2.4, help="the same headroom on an H100 and an H200")
    parser.add_argument("--budget-s", type=float, default=480.0, help="then what still runs is cancelled")
    parser.add_argument("--dry", action="store_true", help="CPU: the sim worker on one simulated card of --leave-gib")
    args = parser.parse_args(argv)
    exit_through_finally_on_sigterm()
    work, out = args.work.resolve(), args.out.resolve()
    tag_dir, db = fresh_tag_dir(work, out, "learn")
    backend = "sim" if args.dry else "nvml"
    if args.dry:
        use_sim_gpus(tag_dir, f"1x{int(args.leave_gib)}GiB")
    data_dir = sample_rte(work, 4000)
    model = "tiny-llama" if args.dry else llama_1_3b(work)
    plans = tag_dir / "plans"
    write_plans(plans, model, data_dir, args.max_steps, sim=args.dry)
    meta: dict[str, Any] = {"tag": "learn", "gpu_plan": args.gpu_plan, "seeds": args.seeds,
                            "max_steps": args.max_steps, "leave_gib": args.leave_gib, "dry": args.dry}  # fmt: skip
    ballast = None
    if not args.dry:
        ballast, meta["ballast"] = start_ballast(work, args.leave_gib)
    daemon = None
    try:
        for seed in range(1, args.seeds + 1):
            for suite in SUITES:
                orch(["submit", "--suite", suite, "--pairs", f"{seed}:glue-tvt_rte", "--gpu-plan", args.gpu_plan],
                     db, plans)  # fmt: skip
        daemon = start_daemon(db, ["--backend", backend, "--poll", "0.5", "--headroom", str(args.headroom),
                                   "--headroom-max-gib", str(args.headroom_max_gib)])  # fmt: skip
        watch_sweep(db, daemon, tag_dir / "frames", meta, args.budget_s, 30.0)
    finally:
        end_sweep(db, tag_dir, meta, daemon, ballast)
        (tag_dir / "dumps" / "memory.json").write_text(orch(["memory", "--json"], db, check=False))
        free_mib = int(args.leave_gib * 1024)
        # the daemon's headroom is a fraction of the card's total, capped; the cap binds here
        # (a card's total is at least the memory left to the sweep)
        headroom_mib = int(min(args.headroom * free_mib, args.headroom_max_gib * 1024))
        slots = int(args.gpu_plan.split(",")[0])
        summary = {"meta": meta, **summarize(tag_dir, free_mib, slots, headroom_mib)}
        (out / "learn-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps(summary, indent=2), flush=True)
        pack_out(tag_dir, out, "learn")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
