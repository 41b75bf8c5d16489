"""A `worker: lora` suite through orch with the GLA-1.3B shape on a real GPU.

    python benchmarks/gpu/gla_sweep.py make-gla --dir /tmp/gla/gla-1.3b     # random GLA, bf16
    python benchmarks/gpu/gla_sweep.py --work /tmp/gla --out OUT --model /tmp/gla/gla-1.3b
    python benchmarks/gpu/gla_sweep.py --dry --work /tmp/gla-dry --out /tmp/out   # CPU, sim GPUs

What it does: toy GLUE data (rte); a suite `glasweep` with `worker: lora` (orch predicts each
job's memory from its own estimate) and two LoRA configs written with GLA's target names,
QKVO r=8 and QKVO+G+GK r=8, x `--seeds` seeds; the daemon with the NVML backend (sim in
`--dry`, where the model is tiny-llama and the GLA-only targets are dropped by the worker);
`orch status --once` frames; at the end `orch results --json`, every job dump and the run
dirs' small files in OUT/sweep-TAG.tar.gz, a summary in OUT/summary-TAG.json and the results
in OUT/results-TAG.json. No ballast: the card is all free.
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
    orch,
    pack_out,
    sample_rte,
    start_daemon,
    use_sim_gpus,
    watch_sweep,
)

# GLA-1.3B (fla-hub/gla-1.3B-100B): hidden 2048, 24 layers, 4 heads, vocab 32000
GLA_1_3B: dict[str, Any] = dict(hidden_size=2048, num_hidden_layers=24, num_heads=4, vocab_size=32000)  # fmt: skip
QKVO = ["attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj"]
CONFIGS: dict[str, list[str]] = {
    "QKVO_r8": QKVO,
    "QKVO_G_GK_r8": [*QKVO, "attn.g_proj", "attn.gk_proj.0", "attn.gk_proj.1"],
}


def make_gla(directory: Path) -> None:
    """A random GLA of 1.3B shape in bf16 plus the toy word-level tokenizer, built on the GPU."""
    import torch
    from fla.models import GLAConfig, GLAForCausalLM

    from workers.lora.model import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = GLAConfig(**GLA_1_3B, tie_word_embeddings=False, use_cache=False,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):
        model: Any = GLAForCausalLM(config).to(torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    print(f"GLA saved: {n_params / 1e9:.3f} B parameters", flush=True)


def write_plans(plans: Path, model: str, data_dir: Path, args: argparse.Namespace) -> None:
    (plans / "suites").mkdir(parents=True, exist_ok=True)
    config_dir = plans / "configs" / "glasweep"
    config_dir.mkdir(parents=True, exist_ok=True)
    for name, targets in CONFIGS.items():
        peft = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "bias": "none",
                "task_type": "CAUSAL_LM", "target_modules": targets}  # fmt: skip
        config = {"model": model, "peft": peft, "data_dir": str(data_dir), "learning_rate": 3e-4,
                  "max_steps": args.max_steps, "batch_size": args.batch, "prec": "bf16",
                  "gradient_accumulation_steps": 1, "gradient_checkpointing": False,
                  "num_data_workers": 2, "max_seq_len": args.max_seq_len, "no_save": True}  # fmt: skip
        (config_dir / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    if os.environ.get("TRITON_CACHE_DIR"):  # the kernels the warm-up compiled
        env["TRITON_CACHE_DIR"] = os.environ["TRITON_CACHE_DIR"]
    if args.dry:
        env["ORCH_WORKER_DEVICE"] = "cpu"
    suite = {"description": "GLA-1.3B shape, random weights, through orch on a real GPU",
             "worker": "lora", "mem_gib": 12, "one_token_tasks": ["glue*"], "max_attempts": 4,
             "hang_timeout_s": 300, "env": env, "configs": list(CONFIGS)}  # fmt: skip
    (plans / "suites" / "glasweep.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))


def sweep(args: argparse.Namespace) -> int:
    work, out = args.work.resolve(), args.out.resolve()
    tag_dir, db = fresh_tag_dir(work, out, args.tag)
    backend = "sim" if args.dry else "nvml"
    if args.dry:
        use_sim_gpus(tag_dir, "1x24GiB")
    data_dir = sample_rte(work, 1000)
    model = "tiny-llama" if args.dry else str(args.model.resolve())
    plans = tag_dir / "plans"
    write_plans(plans, model, data_dir, args)
    meta: dict[str, Any] = {"tag": args.tag, "gpu_plan": args.gpu_plan, "configs": list(CONFIGS),
                            "seeds": args.seeds, "max_steps": args.max_steps, "batch": args.batch,
                            "model": model, "dry": args.dry}  # fmt: skip
    sampler = Sampler(backend, tag_dir / "nvml.csv", args.sample_s, None)
    sampler.start()
    daemon = None
    try:
        for seed in range(1, args.seeds + 1):
            orch(["submit", "--suite", "glasweep", "--pairs", f"{seed}:glue-tvt_rte",
                  "--gpu-plan", args.gpu_plan, "--json"], db, plans)  # fmt: skip
        meta["submitted_at"] = time.time()
        daemon = start_daemon(db, ["--backend", backend, "--poll", str(args.poll_s)])
        watch_sweep(db, daemon, tag_dir / "frames", meta, args.budget_s, args.frame_s)
    finally:
        sampler.stop.set()
        sampler.join(10)
        end_sweep(db, tag_dir, meta, daemon, None)
        results = orch(["results", "--json"], db, check=False)
        (tag_dir / "dumps" / "results.json").write_text(results)
        (out / f"results-{args.tag}.json").write_text(results)
        print(results, flush=True)
        pack_out(tag_dir, out, args.tag)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("make-gla").add_argument("--dir", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/orch-gla"))
    parser.add_argument("--out", type=Path, default=Path("gla-sweep-out"))
    parser.add_argument("--model", type=Path, help="a GLA model directory (make-gla)")
    parser.add_argument("--tag", default="gla")
    parser.add_argument("--gpu-plan", default="2")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-seq-len", type=int, default=64)
    parser.add_argument("--poll-s", type=float, default=0.5)
    parser.add_argument("--frame-s", type=float, default=15.0)
    parser.add_argument("--sample-s", type=float, default=2.0)
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--dry", action="store_true", help="CPU: sim GPUs, tiny-llama")
    args = parser.parse_args(argv)
    exit_through_finally_on_sigterm()
    if args.command == "make-gla":
        make_gla(args.dir)
        return 0
    if not args.dry and args.model is None:
        parser.error("--model is required unless --dry")
    return sweep(args)


if __name__ == "__main__":
    raise SystemExit(main())
