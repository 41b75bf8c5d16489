"""Peak memory and throughput of LoRA fine-tuning, to calibrate orch's memory predictions.

GLA-1.3B-shaped (through fla, when importable) and a Llama of similar size, random weights,
LoRA r=8 on q/k/v/o, sequence length 256, bf16; batch 4/8/16 with and without gradient
checkpointing and logits_to_keep=1. Meant for a GPU:

    python benchmarks/lora_memory.py --out benchmarks/results/lora_memory_h200.json

`--device cpu --tiny` is a seconds-long smoke run of the same code path.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
VARIANTS = (
    (False, 0),
    (True, 0),
    (False, 1),
    (True, 1),
)  # (gradient checkpointing, logits_to_keep)


def build(kind: str, tiny: bool) -> Any:
    """A random-initialised causal LM of the given shape."""
    if kind == "gla":
        from fla.models import GLAConfig, GLAForCausalLM

        gla_shape: dict[str, Any] = dict(
            hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=256) if tiny else dict(
            hidden_size=2048, num_hidden_layers=24, num_heads=4, vocab_size=32000)  # fmt: skip
        return GLAForCausalLM(GLAConfig(**gla_shape, tie_word_embeddings=False, use_cache=False))
    from transformers import LlamaConfig, LlamaForCausalLM

    shape: dict[str, Any] = dict(hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=2,
                 num_key_value_heads=2, vocab_size=256) if tiny else dict(
        hidden_size=2048, num_hidden_layers=24, intermediate_size=5632, num_attention_heads=16,
        num_key_value_heads=16, vocab_size=32000)  # fmt: skip
    return LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=False, use_cache=False))


def measure(
    kind: str, batch: int, checkpointing: bool, logits_to_keep: int, args: argparse.Namespace
) -> dict[str, Any]:
    import torch
    from peft import LoraConfig, get_peft_model

    from workers.lora.model import enable_checkpointing
    from workers.lora.train import answer_logits

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    row: dict[str, Any] = {"model": kind, "batch": batch, "seq_len": args.seq_len,
                           "gradient_checkpointing": checkpointing, "logits_to_keep": logits_to_keep}  # fmt: skip
    model = None
    try:
        with torch.device(device):
            model = build(kind, args.tiny).to(dtype)
        if device.type == "cuda":
            # the peak counts from here: the fp32 weights the build made (5.2 GiB for 1.3 B
            # parameters) are gone after the cast and must not set a floor under training
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            row["weights_mib"] = round(torch.cuda.memory_allocated(device) / MIB)
        lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])  # fmt: skip
        model = get_peft_model(model, lora)
        if checkpointing:
            enable_checkpointing(model)
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        vocab = 256 if args.tiny else 32000  # the shapes built above
        generator = torch.Generator().manual_seed(0)
        input_ids = torch.randint(0, vocab, (batch, args.seq_len), generator=generator).to(device)
        batch_tensors = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "position_ids": torch.arange(args.seq_len, device=device).expand(batch, -1),
        }
        targets = torch.randint(0, vocab, (batch,), generator=generator).to(device)
        timed_s = 0.0
        for step in range(args.warmup + args.steps):
            started_s = time.perf_counter()
            with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
                logits = answer_logits(model, batch_tensors, logits_to_keep, kind)
            torch.nn.functional.cross_entropy(logits, targets).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if step == 0:  # the first step compiles (fla's Triton kernels): how long it took
                row["first_step_s"] = round(time.perf_counter() - started_s, 2)
            if step >= args.warmup:
                timed_s += time.perf_counter() - started_s
        row["samples_per_s"] = round(batch * args.steps / timed_s, 2)
        row["status"] = "ok"
    except torch.OutOfMemoryError as exc:
        row["status"] = "oom"
        row["error"] = str(exc).splitlines()[0]
    finally:
        if device.type == "cuda":
            row["peak_reserved_mib"] = round(torch.cuda.max_memory_reserved(device) / MIB)
            row["peak_allocated_mib"] = round(torch.cuda.max_memory_allocated(device) / MIB)
        else:
            row["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def render(rows: list[dict[str, Any]]) -> str:
    memory_key = (
        "peak_reserved_mib" if any("peak_reserved_mib" in r for r in rows) else "peak_rss_mib"
    )
    lines = [f"{'model':6} {'batch':>5} {'ckpt':>5} {'keep':>4} {'status':>6} {memory_key:>18} "
             f"{'allocated_mib':>13} {'samples/s':>10}"]  # fmt: skip
    for r in rows:
        lines.append(
            f"{r['model']:6} {r['batch']:>5} {r['gradient_checkpointing']!s:>5} {r['logits_to_keep']:>4} "
            f"{r['status']:>6} {r.get(memory_key, ''):>18} {r.get('peak_allocated_mib', ''):>13} "
            f"{r.get('samples_per_s', ''):>10}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes: a smoke run")
    parser.add_argument("--models", default="gla,llama")
    parser.add_argument("--batches", default="4,8,16")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--traceback-every-s", type=float, default=0.0,
                        help="dump every thread's stack to stderr this often (0: never)")  # fmt: skip
    args = parser.parse_args(argv)
    import torch

    kinds = [k for k in args.models.split(",") if k]
    if "gla" in kinds:
        try:
            import fla  # noqa: F401
        except ImportError:
            print("fla is not importable: skipping the GLA model", file=sys.stderr)
            kinds.remove("gla")
        else:
            if args.device == "cpu":
                print("fla kernels need a GPU: skipping the GLA model", file=sys.stderr)
                kinds.remove("gla")
    if args.traceback_every_s > 0:  # a hang (a kernel compile, a deadlock) shows where it is
        faulthandler.dump_traceback_later(args.traceback_every_s, repeat=True, file=sys.stderr)
    meta = {"torch": torch.__version__, "python": platform.python_version(), "device": args.device,
            "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
            "tiny": args.tiny, "steps": args.steps, "warmup": args.warmup,
            "peak_window": "after the model is built and cast"}  # fmt: skip
    rows: list[dict[str, Any]] = []
    for kind in kinds:
        for batch in (int(b) for b in args.batches.split(",")):
            for checkpointing, keep in VARIANTS:
                rows.append(measure(kind, batch, checkpointing, keep, args))
                print(render(rows[-1:]).splitlines()[-1], flush=True)
                if args.out:  # after every row: a run cut short keeps what it measured
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    faulthandler.cancel_dump_traceback_later()
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
