"""`share_base` on one GPU: the built-in LoRA worker's sweep one job at a time, through today's
orch (`share_base: off`), and with `share_base: sequential`, on the same warm machine.

    python benchmarks/gpu/share_base_sweep.py --work /tmp/share --out OUT            # GPU
    python benchmarks/gpu/share_base_sweep.py --dry --work /tmp/share-dry --out /tmp/out  # CPU

The sweep: a random Llama of about 210M parameters (hidden 1024, 12 layers, bf16, as in
trl_sweep.py) with the toy word-level tokenizer; RTE-sized sample data (2,490 train, 277 validation
examples); 4 LoRA configs (r 8 on q/v at 3e-4, r 16 on q/k/v/o at 3e-4, r 8 on q/v at 1e-3, r 4 on
q/k/v/o/gate/up/down at 5e-4; LoRA dropout 0.05) × `--seeds` seeds, one epoch, batch 16, no
checkpoints. Modes, each a fresh state database and `orch daemon run` on the GPU: `serial` (plan 1,
off), `off` (plan `--plan`, today's orch), `sequential` (plan `--plan`), `fusedN` (`share_base:
fused`, `fused_members: N`, plan `--plan`); `--modes` must name `off` (`--modes off,sequential`
leaves out `serial`, which takes longest). `--size 1b3` trains a 1.3B Llama-shaped model
(GLA-1.3B's width and depth) instead. Writes OUT/share-base.json: per mode the makespan (daemon
start to every job ended) and each job's figures and the times of its first and last step
(OUT/share-base-partial.json as each mode ends); prints the makespans, each mode's span of first
and last steps, the speed-ups against the goals (sequential >= 1.5x off; fused >= 2x off and
>= 3x serial), whether every per-seed figure of `sequential` equals `off`'s bit for bit, and how
far each fused mode's figures are from `off`'s. `--dry`: the tiny Llama on CPU, simulated GPUs, 2
configs, 20 steps (checks the script, not the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.gpu.sweep_common import finish, orch, start_daemon  # noqa: E402

LLAMA_210M: dict[str, Any] = dict(
    hidden_size=1024,
    num_hidden_layers=12,
    intermediate_size=2816,
    num_attention_heads=16,
    num_key_value_heads=16,
)
# A 1.3B Llama-shaped model (GLA-1.3B's width and depth: hidden 2048, 24 layers), for where fla
# does not install.
LLAMA_1B3: dict[str, Any] = dict(
    hidden_size=2048,
    num_hidden_layers=24,
    intermediate_size=5632,
    num_attention_heads=16,
    num_key_value_heads=16,
)
SIZES = {"210m": LLAMA_210M, "1b3": LLAMA_1B3}
CONFIGS: dict[str, dict[str, Any]] = {
    "qv_r8": {
        "peft": {"r": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]},
        "learning_rate": 3e-4,
    },
    "qkvo_r16": {
        "peft": {"r": 16, "alpha": 32, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        "learning_rate": 3e-4,
    },
    "qv_r8_lr1e3": {
        "peft": {"r": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]},
        "learning_rate": 1e-3,
    },
    "all_r4": {
        "peft": {
            "r": 4,
            "alpha": 8,
            "targets": [
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ],
        },
        "learning_rate": 5e-4,
    },
}
TERMINAL = ("succeeded", "failed", "cancelled")


def make_model(directory: Path, shape: dict[str, Any]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from workers.lora.model import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        **shape,
        vocab_size=len(tokenizer),
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def write_plans(plans: Path, mode: str, model: str, data: Path, dry: bool) -> None:
    (plans / "suites").mkdir(parents=True, exist_ok=True)
    (plans / "configs" / "share").mkdir(parents=True, exist_ok=True)
    names = list(CONFIGS)[:2] if dry else list(CONFIGS)
    for name in names:
        peft = {**CONFIGS[name]["peft"], "dropout": 0.05}
        config = {
            "model": model,
            "data_dir": str(data),
            "batch_size": 16,
            "prec": "bf16",
            "max_seq_len": 256,
            "no_save": True,
            "checkpoint_every_steps": 0,
            **CONFIGS[name],
            "peft": peft,
            **({"max_steps": 20} if dry else {"num_epochs": 1}),
        }
        (plans / "configs" / "share" / f"{name}.yaml").write_text(yaml.safe_dump(config))
    env = {"PYTHONPATH": str(REPO), **({"ORCH_WORKER_DEVICE": "cpu"} if dry else {})}
    suite = {
        "worker": "lora",
        "mem_gib": 4,
        "configs": names,
        "one_token_tasks": ["glue*"],
        "hang_timeout_s": 900,
        "share_base": "off" if mode == "serial" else share_base(mode),
        "env": env,
    }
    if mode.startswith("fused"):
        suite["fused_members"] = int(mode.removeprefix("fused"))
    (plans / "suites" / "share.yaml").write_text(yaml.safe_dump(suite))


def share_base(mode: str) -> str:
    """The suite's share_base for a mode: fusedN is `fused` with N members at most."""
    return "fused" if mode.startswith("fused") else mode


def run_mode(
    work: Path, mode: str, plan: str, model: str, data: Path, seeds: int, dry: bool, mps: bool = False
) -> dict[str, Any]:
    root = work / mode
    root.mkdir(parents=True)
    write_plans(root / "plans", mode, model, data, dry)
    db = root / "state.db"
    pairs = " ".join(f"{seed}:glue-tvt_rte" for seed in range(1, seeds + 1))
    orch(
        [
            "submit",
            "--suite",
            "share",
            "--pairs",
            pairs,
            "--gpu-plan",
            "1" if mode == "serial" else plan,
        ],
        db,
        root / "plans",
    )
    started, started_wall = time.monotonic(), time.time()
    daemon = start_daemon(db, ["--poll", "0.5", *(["--mps"] if mps else [])])
    try:
        while True:
            jobs = json.loads(orch(["jobs", "--json"], db))
            if (
                jobs and all(job["state"] in TERMINAL for job in jobs)
            ) or daemon.poll() is not None:
                break
            time.sleep(1.0)  # polling the sweep's progress
        makespan_s = time.monotonic() - started
    finally:
        finish(db, daemon, None)
    figures: dict[str, Any] = {}
    for result_path in sorted((root / "runs" / "share").glob("*/attempt-*/result.json")):
        _, config, seed, _ = result_path.parent.parent.name.split("-", 3)
        result = json.loads(result_path.read_text())
        progress = (result_path.parent / "progress.jsonl").read_text().splitlines()
        steps = [line for line in map(_record, progress) if line.get("loss") is not None]
        figures[f"{config} {seed}"] = {
            "status": result["status"],
            "metrics": result.get("metrics"),
            "best_step": result.get("best_step"),
            "final_loss": result.get("final_loss"),
            "peak_mem_mib": result.get("peak_mem_mib"),
            "share_base": result.get("share_base", "off"),
            "fused_members_max": result.get("fused_members_max"),
            "attempt": result_path.parent.name,
            # a liveness line during a long evaluation carries "loss": null, and how many of
            # those a run writes depends on timing: only the steps' losses are compared
            "losses": [line["loss"] for line in steps],
            # the job's timeline, seconds after the daemon started: its first and last step
            "first_step_s": round(steps[0]["t"] - started_wall, 1) if steps else None,
            "last_step_s": round(steps[-1]["t"] - started_wall, 1) if steps else None,
        }
    firsts = [f["first_step_s"] for f in figures.values() if f["first_step_s"] is not None]
    lasts = [f["last_step_s"] for f in figures.values() if f["last_step_s"] is not None]
    if firsts and lasts:
        print(f"{mode}: first steps {min(firsts)}-{max(firsts)} s, last steps {min(lasts)}-{max(lasts)} s "
              "after the daemon started", flush=True)  # fmt: skip
    return {
        "makespan_s": round(makespan_s, 1),
        "jobs": {j["id"]: j["state"] for j in jobs},
        "figures": figures,
    }


def _record(line: str) -> dict[str, Any]:
    """A progress.jsonl line (the worker's file): {} where it is not a JSON object (a last line
    cut short, say)."""
    try:
        record = json.loads(line)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def same_numbers(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("metrics", "best_step", "final_loss", "losses")
    return all(a.get(k) == b.get(k) for k in keys)


def largest_gaps(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """Over the jobs both ran: the largest |difference| of the final loss and of each val and
    test metric (fused runs are not bit-equal to solo ones: how far they are)."""
    gaps: dict[str, float] = {}
    for key in sorted(set(a) & set(b)):
        pairs = [("final_loss", a[key].get("final_loss"), b[key].get("final_loss"))]
        for split in ("val", "test"):
            mine = ((a[key].get("metrics") or {}).get(split)) or {}
            theirs = ((b[key].get("metrics") or {}).get(split)) or {}
            pairs += [(f"{split}_{m}", mine[m], theirs.get(m)) for m in mine]
        for name, x, y in pairs:
            if isinstance(x, int | float) and isinstance(y, int | float):
                gaps[name] = max(gaps.get(name, 0.0), round(abs(x - y), 6))
    return gaps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--plan", default="4", help="jobs per card for off and sequential")
    parser.add_argument("--dry", action="store_true", help="tiny Llama on CPU, simulated GPUs")
    parser.add_argument("--size", choices=sorted(SIZES), default="210m", help="the Llama's size")
    parser.add_argument(
        "--modes",
        default="serial,off,sequential",
        help="which of serial,off,sequential,fusedN (fused with N members at most) to run; "
        "off and sequential are always compared",
    )
    parser.add_argument("--mps", action="store_true", help="every mode's daemon runs with --mps")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dry:
        os.environ |= {
            "ORCH_GPU_BACKEND": "sim",
            "ORCH_SIM_GPUS": "1x24GiB",
            "ORCH_SIM_DIR": str(args.work / "sim"),
        }
        model = "tiny-llama"
    else:
        model = str(args.work / f"llama-{args.size}")
        make_model(Path(model), SIZES[args.size])
    data = args.work / "data"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.lora.sample_data",
            "--out",
            str(data),
            "--tasks",
            "rte",
            "--n-train",
            "40" if args.dry else "2490",
            "--n-dev",
            "16" if args.dry else "277",
        ],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in ("serial", "off", "sequential") and not (
            mode.startswith("fused") and mode.removeprefix("fused").isdigit()
        ):
            parser.error(f"unknown mode {mode!r}")
    if "off" not in modes:
        parser.error("--modes must name off (today's orch, what every mode is compared with)")
    runs: dict[str, dict[str, Any]] = {}
    for mode in modes:  # each mode's figures are written as it ends: a call cut short keeps them
        runs[mode] = run_mode(args.work, mode, args.plan, model, data, args.seeds, args.dry, args.mps)
        print(f"{mode}: makespan {runs[mode]['makespan_s']} s", flush=True)
        (args.out / "share-base-partial.json").write_text(json.dumps({"runs": runs}, indent=1))
    off = runs["off"]["figures"]
    sequential = runs["sequential"]["figures"] if "sequential" in runs else None
    differing = (
        sorted(k for k in off if k not in sequential or not same_numbers(off[k], sequential[k]))
        if sequential is not None
        else None
    )
    makespan_s = {mode: run["makespan_s"] for mode, run in runs.items()}
    summary: dict[str, Any] = {
        "seeds": args.seeds,
        "plan": args.plan,
        "mps": args.mps,
        "makespan_s": makespan_s,
    }
    if "sequential" in runs:
        summary["sequential_vs_off"] = round(makespan_s["off"] / makespan_s["sequential"], 3)
    if "serial" in runs:
        serial = runs["serial"]["figures"]
        summary |= {
            "sequential_vs_serial": round(makespan_s["serial"] / makespan_s["sequential"], 3),
            "off_vs_serial": round(makespan_s["serial"] / makespan_s["off"], 3),
            "serial_equals_off": all(same_numbers(serial[k], off[k]) for k in off if k in serial),
        }
    for mode in (m for m in runs if m.startswith("fused")):
        fused = runs[mode]["figures"]
        summary[mode] = {
            "vs_off": round(makespan_s["off"] / makespan_s[mode], 3),
            "vs_serial": round(makespan_s["serial"] / makespan_s[mode], 3) if "serial" in runs else None,
            "fused_jobs": sum(f["share_base"] == "fused" for f in fused.values()),
            "largest_group": max((f["fused_members_max"] or 0 for f in fused.values()), default=0),
            "largest_gap_to_off": largest_gaps(fused, off),
        }
    summary |= {
        "warm_jobs": (
            sum(f["share_base"] == "sequential" for f in sequential.values())
            if sequential is not None
            else None
        ),
        "jobs": len(off),
        "differing_from_off": differing,
        "oom_attempts": {
            m: sum(f["status"] == "oom" for f in r["figures"].values()) for m, r in runs.items()
        },
    }
    (args.out / "share-base.json").write_text(
        json.dumps({"summary": summary, "runs": runs}, indent=1)
    )
    print(json.dumps(summary, indent=1))
    if "sequential" in runs:
        print(
            f"goal: sequential >= 1.5x off: {summary['sequential_vs_off']:.2f}x; "
            "identical to solo runs: "
            f"{'yes' if not differing else 'no'}"
        )
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
