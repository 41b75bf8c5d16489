"""A training script that has never heard of orch: it reads its flags, prints a JSON line per
step and its final metrics as the last JSON line. Standard library only, runs in 15 s; the
tutorial in the README runs it under orch."""

from __future__ import annotations

import argparse
import json
import math
import random
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    # no data loader here; taken so that orch's ladder can lower it like a real script's
    parser.add_argument("--num-data-workers", type=int, default=0)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    loss = 2.0
    for step in range(1, args.steps + 1):
        loss *= math.exp(-args.lr * 30) * (1 + rng.uniform(-0.02, 0.02))
        print(json.dumps({"step": step, "total": args.steps, "loss": round(loss, 4)}), flush=True)
        time.sleep(0.25)  # a step of real training: long enough to watch the sweep (README step 4)
    accuracy = min(0.99, 0.5 + 0.45 * (1 - loss / 2.0) + rng.uniform(-0.01, 0.01))
    print(json.dumps({"accuracy": round(accuracy, 4), "eval_loss": round(loss, 4)}), flush=True)


if __name__ == "__main__":
    main()
