"""One LoRA training step of a GLA model on the worker's own code path, with timestamps.

    TRITON_CACHE_DIR=/tmp/gla/triton timeout 240 python benchmarks/gpu/gla_warmup.py \
        --model /tmp/gla/gla-1.3b --traceback-every-s 60

Run before a GLA sweep, in its own process: the first forward and backward compile fla's Triton
kernels (into TRITON_CACHE_DIR, which the sweep's workers then reuse). Every phase prints the
seconds since start, and every `--traceback-every-s` every thread's stack goes to stderr, so a
compile that never ends (or a deadlock) shows where it is. The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
STARTED_S = time.monotonic()
QKVO_G_GK = ["attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "attn.g_proj",
             "attn.gk_proj.0", "attn.gk_proj.1"]  # fmt: skip
TEXTS = [
    "the cat sat on the mat . question : the cat sat ? answer :",
    "a dog runs . question : a dog sleeps ? answer :",
]


def stamp(phases: dict[str, float], name: str) -> None:
    phases[name] = round(time.monotonic() - STARTED_S, 2)
    print(f"[{phases[name]:8.2f} s] {name}", flush=True)


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up(args: argparse.Namespace) -> dict[str, Any]:
    phases: dict[str, float] = {}
    import torch

    stamp(phases, "torch imported")
    from workers.lora.config import RunConfig
    from workers.lora.model import apply_lora, load_model
    from workers.lora.train import answer_logits

    config = RunConfig(model=str(args.model), peft={"r": 8, "lora_alpha": 16, "target_modules": QKVO_G_GK},
                       data="glue-tvt_rte", data_dir=None)  # fmt: skip
    model, tokenizer, kind = load_model(config, torch.bfloat16)
    stamp(phases, f"model loaded ({kind})")
    model, _warnings = apply_lora(model, config.peft, kind)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    model = model.to(device)
    model.train()
    stamp(phases, "LoRA applied, model on the device")
    texts = (TEXTS * args.batch)[: args.batch]
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    batch = {k: v.to(device) for k, v in encoded.items() if k in ("input_ids", "attention_mask")}
    # left padding: positions count from the first real token (Llama uses them, GLA does not)
    batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    targets = torch.zeros(args.batch, dtype=torch.long, device=device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for step in range(args.steps):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
            logits = answer_logits(model, batch, 0, kind)
        sync(device)
        stamp(phases, f"step {step}: forward")
        torch.nn.functional.cross_entropy(logits, targets).backward()
        sync(device)
        stamp(phases, f"step {step}: backward")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
        answer_logits(model, batch, 1, kind)
    sync(device)
    stamp(phases, "eval forward")
    return {"phases_s": phases, "batch": args.batch, "seq_len": int(batch["input_ids"].shape[1]),
            "peak_reserved_mib": round(torch.cuda.max_memory_reserved() / 2**20) if on_gpu else None}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run with a Llama directory")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--traceback-every-s", type=float, default=60.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    faulthandler.dump_traceback_later(args.traceback_every_s, repeat=True, file=sys.stderr)
    summary = warm_up(args)
    faulthandler.cancel_dump_traceback_later()
    print(json.dumps(summary), flush=True)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
