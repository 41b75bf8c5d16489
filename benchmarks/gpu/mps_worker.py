"""One GPU training process for the MPS benchmark (benchmarks/gpu/mps_bench.py): a Llama of about
210M parameters (random weights, bf16) with LoRA r=16 on q/k/v/o, training on random tokens.

    python benchmarks/gpu/mps_worker.py --steps 60 --batch 32 --seq 256 [--phases DIR --rank R]
    python benchmarks/gpu/mps_worker.py --fault-after-s 5    # then an illegal memory access

Alone it prints `step N/M loss X` lines (orch reads them as progress) and, at the end, one JSON
line with its training time (start-up excluded). With `--phases DIR` it builds and warms up,
writes DIR/ready-R, and then for each phase file DIR/go-K that names its rank runs `--steps`
timed steps and writes DIR/done-K-R (JSON: seconds, steps): the benchmark lets 1, 2, 3, then 4
processes train at once with the same warm processes. `--alloc-mib` first allocates that much
and prints `alloc ok` or the out-of-memory error (the MPS memory fence's check).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def build(batch: int, seq: int) -> tuple[Any, Any, Any]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16,
                         num_key_value_heads=16, vocab_size=8000, max_position_embeddings=seq)
    model: Any = LlamaForCausalLM(config)
    model = model.to(torch.bfloat16).cuda()
    model = get_peft_model(
        model,
        LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    tokens = torch.randint(0, 8000, (batch, seq), device="cuda")
    return model, optimizer, tokens


def step(model: Any, optimizer: Any, tokens: Any) -> float:
    out = model(input_ids=tokens, labels=tokens)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(out.loss.detach())


def timed(model: Any, optimizer: Any, tokens: Any, steps: int, say: bool) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.monotonic()
    for n in range(1, steps + 1):
        loss = step(model, optimizer, tokens)
        if say:
            print(f"step {n}/{steps} loss {loss:.4f}", flush=True)
    torch.cuda.synchronize()
    return time.monotonic() - start


def fault() -> None:
    """An illegal memory access: a kernel writes through a pointer to nowhere."""
    import cupy

    kernel = cupy.RawKernel(r'extern "C" __global__ void bad(int *p) { p[threadIdx.x] = 1; }', "bad")
    kernel((1,), (32,), (cupy.uint64(0x10),))
    cupy.cuda.runtime.deviceSynchronize()


def phases(args: argparse.Namespace, model: Any, optimizer: Any, tokens: Any) -> None:
    folder = Path(args.phases)
    (folder / f"ready-{args.rank}").write_text("1")
    for k in range(1, 64):
        go = folder / f"go-{k}"
        while not go.exists():
            if (folder / "stop").exists():
                return
            time.sleep(0.01)
        ranks = json.loads(go.read_text())
        if args.rank in ranks:
            seconds = timed(model, optimizer, tokens, args.steps, False)
            (folder / f"done-{k}-{args.rank}").write_text(json.dumps({"seconds": seconds, "steps": args.steps}))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--phases", default=None)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--alloc-mib", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (0: the first step is printed)")
    parser.add_argument("--fault-after-s", type=float, default=None)
    parser.add_argument("--run-s", type=float, default=None, help="train this long instead of --steps")
    args = parser.parse_args()
    import torch

    began = time.monotonic()
    if args.alloc_mib:
        try:
            block = torch.empty(args.alloc_mib << 20, dtype=torch.uint8, device="cuda")
            print(f"alloc ok {args.alloc_mib} MiB", flush=True)
            del block
        except torch.OutOfMemoryError as exc:
            print(f"alloc oom {args.alloc_mib} MiB: {str(exc).splitlines()[0]}", flush=True)
            return 3
    model, optimizer, tokens = build(args.batch, args.seq)
    for _ in range(args.warmup):
        step(model, optimizer, tokens)
    if args.phases:
        phases(args, model, optimizer, tokens)
        return 0
    if args.fault_after_s is not None:
        deadline = time.monotonic() + args.fault_after_s
        while time.monotonic() < deadline:
            step(model, optimizer, tokens)
        print("faulting now", flush=True)
        fault()
        return 0
    if args.run_s is not None:
        deadline, steps = time.monotonic() + args.run_s, 0
        torch.cuda.synchronize()
        start = time.monotonic()
        while time.monotonic() < deadline:
            step(model, optimizer, tokens)
            steps += 1
        torch.cuda.synchronize()
        print(json.dumps({"train_s": time.monotonic() - start, "steps": steps, "ok": True}), flush=True)
        return 0
    train_s = timed(model, optimizer, tokens, args.steps, True)
    print(json.dumps({"train_s": round(train_s, 3), "startup_s": round(time.monotonic() - began - train_s, 3),
                      "steps": args.steps, "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
                      "fence": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
