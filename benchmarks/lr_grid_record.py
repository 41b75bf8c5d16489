"""Records learning curves of the LoRA worker over a learning-rate x LoRA-rank grid, for the
early-stopping benchmark (benchmarks/early_stop_sim.py `--curves recorded`).

The tiny Llama on CPU, fp32, trained by the worker's own loop (`workers.lora.train.run`) with the
base and the tokenised data loaded once for every run, as a `share_base: sequential` process
keeps them (`workers.lora.base_cache.BaseCache`). Every run's validation history is read back
from the progress.jsonl the worker wrote (the file orch follows) and kept, compact, in one JSON.

The task (`cues`) is RTE-shaped and harder than the stock sample data, whose one keyword gives
the label away: 1, 3 or 5 cue words (6 positive, 6 negative) lie among neutral filler over both
sentences, and the pair is `entailment` when most cues are positive, so the answer needs every
cue of both sentences and a 3-2 or 2-1 majority is harder than a single cue. A share of the labels
(default 15 %) is flipped in train.tsv (the train and validation splits of `glue-tvt_rte`) and in
dev.tsv (its test split), so no setting reaches 1.0, and the validation split is large (default
400 examples) so that accuracy moves in steps of 0.0025. Final accuracy rises and falls with the
learning rate (too small: still near the majority class after the run; too large: unstable).

    python -m benchmarks.lr_grid_record [--seeds 1-6] [--steps 480] [--eval-every 16]
                                        [--out benchmarks/results/lr_grid_curves.json]
    (the committed file: `--seeds 1-3 --out A.json` and `--seeds 4-6 --out B.json` at once, each
    under `nice`, then the merge below)
    python -m benchmarks.lr_grid_record --merge A.json B.json --out C.json  # seeds recorded apart
    python -m benchmarks.lr_grid_record --probe   # one run per learning rate at rank 8: the step time
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from workers.harness import Heartbeat
from workers.lora import train
from workers.lora.base_cache import BaseCache
from workers.lora.config import parse_config
from workers.lora.sample_data import FILLER

LEARNING_RATES = [2e-4, 2e-2]  # the default span, 11 rates log-spaced over it


def learning_rates(low: float, high: float, n: int = 11) -> list[float]:
    return [float(f"{low * (high / low) ** (i / (n - 1)):.4g}") for i in range(n)]


RANKS = [4, 8, 16, 32]
TARGETS = ["q_proj", "v_proj", "lm_head"]
OUT = Path(__file__).resolve().parent / "results" / "lr_grid_curves.json"
LABELS = ("entailment", "not_entailment")


POSITIVE = ("red", "sun", "day", "friend", "music", "park")
NEGATIVE = ("blue", "moon", "night", "river", "road", "door")
NEUTRAL = tuple(w for w in FILLER if w not in POSITIVE + NEGATIVE)


def cue_examples(n: int, rng: random.Random, noise: float) -> list[tuple[str, str, str]]:
    """(sentence 1, sentence 2, label): 1, 3 or 5 cue words spread over both sentences among
    neutral filler; entailment when most cues are positive; a `noise` share of labels flipped."""
    rows = []
    for _ in range(n):
        cues = [
            rng.choice(POSITIVE if rng.random() < 0.5 else NEGATIVE)
            for _ in range(rng.choice((1, 3, 5)))
        ]
        words: list[list[str]] = [
            [rng.choice(NEUTRAL) for _ in range(rng.randint(3, 6))] for _ in range(2)
        ]
        for cue in cues:
            side = words[rng.randrange(2)]
            side.insert(rng.randrange(len(side) + 1), cue)
        positive = sum(c in POSITIVE for c in cues) * 2 > len(cues)
        label = positive if rng.random() >= noise else not positive
        rows.append((" ".join(words[0]), " ".join(words[1]), LABELS[0] if label else LABELS[1]))
    return rows


TASK_MAKERS = {"cues": cue_examples}


def write_task(out: Path, task: str, n_train: int, n_dev: int, noise: float, seed: int = 0) -> Path:
    """RTE/train.tsv (its last fifth is glue-tvt's validation split) and RTE/dev.tsv (test)."""
    rng = random.Random(f"{task}:{seed}")
    folder = out / "RTE"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        lines = ["index\tsentence1\tsentence2\tlabel"]
        rows = TASK_MAKERS[task](n, rng, noise)
        lines += [f"{i}\t{a}\t{b}\t{label}" for i, (a, b, label) in enumerate(rows)]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def run_config(
    data: Path, lr: float, rank: int, seed: int, steps: int, eval_every: int
) -> dict[str, Any]:
    return {
        "model": "tiny-llama", "data": "glue-tvt_rte", "data_dir": str(data),
        "peft": {"r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0, "target_modules": TARGETS},
        "batch_size": 8, "learning_rate": lr, "max_steps": steps, "eval_every_steps": eval_every,
        "lr_scheduler": "linear", "warmup_ratio": 0.05, "prec": "fp32", "seed": seed,
        "no_save": True, "checkpoint_every_steps": 0, "eval_batch_size": 100,
    }  # fmt: skip


def shared_config(steps: int, eval_every: int) -> dict[str, Any]:
    """What every run's config holds; what each run sets is written as `per run`."""
    config = run_config(Path("DATA"), 0.0, 0, 0, steps, eval_every)
    config["peft"] |= {"r": "per run", "lora_alpha": "2 r"}
    return config | {"data_dir": "the task's folder", "learning_rate": "per run", "seed": "per run"}


def val_history(progress: Path, metric: str = "accuracy") -> list[list[float]]:
    """[[step, val `metric`], ...] from the worker's progress.jsonl (lines without it skipped)."""
    points = []
    for line in progress.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill or a full disk
        val = record.get("val") if isinstance(record, dict) else None
        if not isinstance(val, dict):
            continue
        step, value = record.get("step"), val.get(metric)
        if isinstance(step, int) and isinstance(value, (int, float)):
            points.append([step, round(float(value), 5)])
    return points


def record_one(cache: BaseCache, data: Path, work: Path, lr: float, rank: int, seed: int, steps: int,
               eval_every: int) -> dict[str, Any]:  # fmt: skip
    run_dir = Path(tempfile.mkdtemp(dir=work))
    config = parse_config(run_config(data, lr, rank, seed, steps, eval_every), run_dir, {})
    started = time.monotonic()
    try:
        outcome = train.run(
            config,
            run_dir,
            Heartbeat(run_dir),
            lambda _: None,
            cache,
            ("tiny-llama", "lr-grid-task"),
        )
    finally:
        cache.release()
    seconds = time.monotonic() - started
    return {
        "lr": lr, "r": rank, "seed": seed, "val": val_history(run_dir / "progress.jsonl"),
        "val_loss": val_history(run_dir / "progress.jsonl", "loss"),
        "test": round(outcome.metrics["test"]["accuracy"], 5), "seconds": round(seconds, 2),
        "train_seconds": round(outcome.train_seconds, 2),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.lr_grid_record", description=__doc__
    )
    parser.add_argument("--seeds", default="1-6", help="run seeds FIRST-LAST (default 1-6)")
    parser.add_argument(
        "--merge", type=Path, nargs="+", help="join recordings of other seeds into --out"
    )
    parser.add_argument("--steps", type=int, default=480)
    parser.add_argument("--eval-every", type=int, default=16)
    parser.add_argument(
        "--n-train", type=int, default=2000, help="train.tsv rows (a fifth become validation)"
    )
    parser.add_argument("--n-dev", type=int, default=200, help="dev.tsv rows (the test split)")
    parser.add_argument("--noise", type=float, default=0.15, help="share of labels flipped")
    parser.add_argument("--task", choices=sorted(TASK_MAKERS), default="cues")
    parser.add_argument("--lr-low", type=float, default=LEARNING_RATES[0])
    parser.add_argument("--lr-high", type=float, default=LEARNING_RATES[-1])
    parser.add_argument(
        "--probe", action="store_true", help="rank 8, seed 1, every learning rate; no JSON"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out)
    first, _, last = args.seeds.partition("-")
    seeds = list(range(int(first), int(last or first) + 1))
    torch.set_num_threads(1)  # one core: the figures must not depend on the machine's thread count
    cache = BaseCache()
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    rates = learning_rates(args.lr_low, args.lr_high)
    grid = [(lr, 8, 1) for lr in rates] if args.probe else [
        (lr, rank, seed) for seed in seeds for rank in RANKS for lr in rates
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="lr-grid-") as folder:
        work = Path(folder)
        data = write_task(work / "data", args.task, args.n_train, args.n_dev, args.noise)
        for lr, rank, seed in grid:
            run = record_one(cache, data, work, lr, rank, seed, args.steps, args.eval_every)
            runs.append(run)
            values = [v for _, v in run["val"]]
            print(f"lr {lr:.3g} r {rank} seed {seed}: val {values[0]:.3f} .. {values[-1]:.3f} (best {max(values):.3f}),"
                  f" test {run['test']:.3f}, {run['seconds']:.1f} s", flush=True)  # fmt: skip
    elapsed_s = time.monotonic() - started
    load = os.getloadavg()
    print(
        f"{len(runs)} runs in {elapsed_s:.0f} s, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
    )
    if args.probe:
        return 0
    document = {
        "what": "val accuracy (`val`) and val loss (`val_loss`) histories of the LoRA worker's tiny Llama "
        "(CPU, fp32, one thread) on the "
        "`cues` task of benchmarks/lr_grid_record.py, one run per (lr, r, seed)",
        "task": {"name": args.task, "n_train_rows": args.n_train, "n_dev_rows": args.n_dev, "label_noise": args.noise},
        "config": shared_config(args.steps, args.eval_every),
        "learning_rates": rates, "ranks": RANKS, "seeds": seeds,
        "steps": args.steps, "eval_every_steps": args.eval_every,
        "wall_seconds": [round(elapsed_s)], "load_average_end": [[round(x, 2) for x in load]],
        "cpu_count": os.cpu_count(), "runs": runs,
    }  # fmt: skip
    args.out.write_text(json.dumps(document, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


def merge(parts: list[Path], out: Path) -> int:
    """One recording from several, each of other seeds of the same grid and settings."""
    documents = [json.loads(part.read_text(encoding="utf-8")) for part in parts]
    joined = documents[0]
    for other in documents[1:]:
        for key in ("task", "config", "learning_rates", "ranks", "steps", "eval_every_steps"):
            if other[key] != joined[key]:
                raise SystemExit(
                    f"{key} differs between the recordings: {joined[key]} vs {other[key]}"
                )
        joined["seeds"] = sorted(set(joined["seeds"]) | set(other["seeds"]))
        joined["wall_seconds"] += other["wall_seconds"]
        joined["load_average_end"] += other["load_average_end"]
        joined["runs"] += other["runs"]
    out.write_text(json.dumps(joined, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {out}: {len(joined['runs'])} runs, seeds {joined['seeds']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
