"""A real sweep through orch on a GPU machine, with memory made scarce on purpose.

    python benchmarks/gpu/run_sweep.py --work /tmp/sweep --out OUT --tag packed --gpu-plan 6
    python benchmarks/gpu/run_sweep.py --work /tmp/sweep --out OUT --tag baseline --gpu-plan 1
    python benchmarks/gpu/run_sweep.py --dry --work /tmp/sweep-dry --out /tmp/out   # CPU, sim GPUs

What it does: toy GLUE data; a Llama of ~1.3B shape (random weights, bf16, saved once); a
`gpusweep` suite (configs x seeds, LoRA r=8 on q/k/v/o) declaring `mem_gib` far below the real
peaks; a ballast process (own session) holding all but `--leave-gib` of every card, so that the
jobs meet real CUDA OOMs; the daemon with the NVML backend; `orch status --once` frames every
`--frame-s`; NVML readings every `--sample-s` into a CSV; at the end every JSON dump, the run
dirs' small files and the daemon log in OUT/sweep-TAG.tar.gz, and a summary in
OUT/summary-TAG.json (benchmarks/gpu/analyze.py). What the sweeps share is in sweep_common.py.

The suite's worker is the command-template form of `workers.lora` (as a researcher's own script
would be): for `worker: lora` orch predicts from its worst-case estimate at `max_seq_len`, which
for this short toy data is far above the real peak, so nothing would OOM.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, on a GPU machine

from benchmarks.gpu.sweep_common import (
    REPO,
    Sampler,
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

# name -> config keys; level 0 of "big" needs well over the declared 4 GiB
CONFIGS: dict[str, dict[str, Any]] = {
    "big_b128": {"batch_size": 128},
    "mid_b64": {"batch_size": 64},
    "small_b16": {"batch_size": 16},
}


def write_plans(plans: Path, model: str, data_dir: Path, max_steps: int, mem_gib: int) -> list[str]:
    (plans / "suites").mkdir(parents=True, exist_ok=True)
    config_dir = plans / "configs" / "gpusweep"
    config_dir.mkdir(parents=True, exist_ok=True)
    peft = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM",
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}  # fmt: skip
    for name, keys in CONFIGS.items():
        config = {"model": model, "peft": peft, "data_dir": str(data_dir), "learning_rate": 3e-4,
                  "max_steps": max_steps, "prec": "bf16", "gradient_accumulation_steps": 1,
                  "gradient_checkpointing": False, "num_data_workers": 2, "max_seq_len": 256,
                  "no_save": True, **keys}  # fmt: skip
        (config_dir / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    suite = {
        "description": "real-GPU sweep of orch: declared memory far too low, ballast on the card",
        "worker": f"{sys.executable} -m workers.lora --config {{config}} --run-dir {{run_dir}}",
        "mem_gib": mem_gib, "one_token_tasks": ["glue*"], "max_attempts": 8, "hang_timeout_s": 300,
        "env": {"PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO)),
                **({"ORCH_WORKER_DEVICE": "cpu"} if model == "tiny-llama" else {})},
        "configs": list(CONFIGS),
    }  # fmt: skip
    (plans / "suites" / "gpusweep.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    return list(CONFIGS)


def sweep(args: argparse.Namespace) -> int:
    work, out = args.work.resolve(), args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    tag_dir, db = fresh_tag_dir(work, out, args.tag)
    backend = "sim" if args.dry else "nvml"
    if args.dry:
        use_sim_gpus(tag_dir, os.environ.get("ORCH_SIM_GPUS", "1x24GiB"))
    data_dir = sample_rte(work, 1000)
    model = "tiny-llama" if args.dry else llama_1_3b(work)
    plans = tag_dir / "plans"
    configs = write_plans(plans, model, data_dir, args.max_steps, args.mem_gib)
    meta: dict[str, Any] = {"tag": args.tag, "gpu_plan": args.gpu_plan, "configs": configs,
                            "seeds": args.seeds, "mem_gib": args.mem_gib, "leave_gib": args.leave_gib,
                            "headroom": args.headroom, "max_steps": args.max_steps, "dry": args.dry}  # fmt: skip
    ballast = None
    if not args.dry and args.leave_gib > 0:
        ballast, meta["ballast"] = start_ballast(work, args.leave_gib)
        print(f"ballast: {meta['ballast']}", flush=True)
    sampler = Sampler(
        backend, tag_dir / "nvml.csv", args.sample_s, ballast.pid if ballast else None
    )
    sampler.start()
    daemon = None
    try:
        for seed in range(1, args.seeds + 1):  # one submit per seed: job ids interleave the configs
            orch(["submit", "--suite", "gpusweep", "--pairs", f"{seed}:glue-tvt_rte", "--gpu-plan", args.gpu_plan,
                  "--json"], db, plans)  # fmt: skip
        meta["submitted_at"] = time.time()
        daemon = start_daemon(db, ["--backend", backend, "--poll", str(args.poll_s), "--headroom", str(args.headroom)])
        watch_sweep(db, daemon, tag_dir / "frames", meta, args.budget_s, args.frame_s)
    finally:
        sampler.stop.set()
        sampler.join(10)
        end_sweep(db, tag_dir, meta, daemon, ballast)
        pack_out(tag_dir, out, args.tag)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/orch-gpu-sweep"))
    parser.add_argument("--out", type=Path, default=Path("gpu-sweep-out"))
    parser.add_argument("--tag", default="packed")
    parser.add_argument("--gpu-plan", default="6")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument(
        "--mem-gib", type=int, default=4, help="declared per-job memory (too low on purpose)"
    )
    parser.add_argument(
        "--leave-gib", type=float, default=24.0, help="memory left free on each card by the ballast"
    )
    parser.add_argument(
        "--headroom",
        type=float,
        default=0.017,
        help="of the card's total: 2.4 GiB on an H200, as 10%% of a 24 GiB card",
    )
    parser.add_argument("--poll-s", type=float, default=0.5)
    parser.add_argument("--frame-s", type=float, default=20.0)
    parser.add_argument("--sample-s", type=float, default=2.0)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--dry", action="store_true", help="CPU: sim GPUs, tiny-llama, no ballast")
    args = parser.parse_args(argv)
    exit_through_finally_on_sigterm()
    return sweep(args)


if __name__ == "__main__":
    raise SystemExit(main())
