"""What each ladder rung keeps in the LoRA worker, measured: every rung against level 0 on one
seed, in bf16 and fp32, with LoRA dropout 0 and 0.05 on q, v and lm_head.

The tiny Llama on CPU, 100 optimizer steps of RTE sample data with a quarter of the training
labels flipped (learnable, not perfectly), batch 8, a validation every 5 steps. Per rung: whether
the per-step losses are bit-equal, the largest relative loss difference, and val, test and best
step against level 0's. The half-batch rungs are cumulative with checkpointing and
logits_to_keep, as the default ladder reaches them.

    python -m benchmarks.ladder_numerics [--steps 100] [--seed 1]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.noisy_rte import flip_every_fourth_label, numerics_config
from workers.harness import Heartbeat
from workers.lora import train
from workers.lora.config import parse_config
from workers.lora.sample_data import main as write_sample_data

EXACT: dict[str, dict[str, Any]] = {"checkpointing": {"gradient_checkpointing": True},
         "logits_to_keep": {"logits_to_keep": 1},
         "data_workers 2 vs 0": {"num_data_workers": 2}}  # fmt: skip
CUMULATIVE: dict[str, Any] = {"gradient_checkpointing": True, "logits_to_keep": 1}
INEXACT: dict[str, dict[str, Any]] = {"half batch 4 x 2": {"batch_size": 4, "gradient_accumulation_steps": 2},
           "1 x 8 + checkpointing + ltk": {**CUMULATIVE, "batch_size": 1, "gradient_accumulation_steps": 8}}


def noisy_rte(root: Path) -> Path:
    write_sample_data(["--out", str(root), "--tasks", "rte", "--n-train", "60", "--n-dev", "40"])
    return flip_every_fourth_label(root)


def run(data: Path, work: Path, steps: int, seed: int, prec: str, dropout: float, **rung: Any) -> train.TrainOutcome:
    raw = numerics_config(data, steps=steps, eval_every_steps=5, prec=prec, seed=seed, dropout=dropout) | rung
    run_dir = Path(tempfile.mkdtemp(dir=work))
    return train.run(parse_config(raw, run_dir, {}), run_dir, Heartbeat(run_dir), lambda _: None)


def compare(base: train.TrainOutcome, other: train.TrainOutcome) -> str:
    equal = other.losses == base.losses
    worst = max(abs(a - b) / abs(b) for a, b in zip(other.losses, base.losses, strict=True))
    scores = (f"val {base.metrics['val']['accuracy']:.3f} -> {other.metrics['val']['accuracy']:.3f}, "
              f"test {base.metrics['test']['accuracy']:.3f} -> {other.metrics['test']['accuracy']:.3f}, "
              f"best step {base.best_step} -> {other.best_step}")  # fmt: skip
    return ("bit-equal" if equal else f"max rel. loss diff {worst:.1e}") + f"; {scores}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ladder_numerics", description=__doc__)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the figures must not depend on the machine's thread count
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        data = noisy_rte(work / "data")
        for prec in ("bf16", "fp32"):
            for dropout in (0.0, 0.05):
                base = run(data, work, args.steps, args.seed, prec, dropout)
                print(f"{prec}, lora_dropout {dropout}: level 0 val {base.metrics['val']['accuracy']:.3f}, "
                      f"test {base.metrics['test']['accuracy']:.3f}, best step {base.best_step}", flush=True)
                for name, rung in {**EXACT, **INEXACT}.items():
                    kind = "exact" if name in EXACT else "inexact"
                    outcome = run(data, work, args.steps, args.seed, prec, dropout, **rung)
                    print(f"  {name} ({kind}): {compare(base, outcome)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
