"""`share_base: fused` against `sequential` in one worker process, on CPU: N jobs of the tiny
Llama (RTE sample data), trained one after another from one loaded base (as a warm process of
`sequential` does), then all at once as one fused group. No daemon: the daemon's side is timed
by benchmarks.share_base_cpu. Prints the seconds of each and the largest relative difference of
a per-step loss between the two (fused numbers are not bit-equal to the jobs alone).

    python -m benchmarks.fused_cpu [--jobs 4] [--steps 12] [--prec bf16]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.noisy_rte import numerics_config
from workers.lora.sample_data import main as write_sample_data


def losses(run_dir: Path) -> list[float]:
    lines = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    return [float(p["loss"]) for p in lines if p.get("loss") is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fused_cpu", description=__doc__)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--prec", default="bf16")
    args = parser.parse_args(argv)
    import torch

    from workers.lora.__main__ import run_attempt
    from workers.lora.base_cache import BaseCache
    from workers.lora.fused import FusedTrainer
    from workers.lora.member import MemberSpec

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="fused-cpu-"))
    data = root / "glue"
    write_sample_data(["--out", str(data), "--tasks", "rte", "--n-train", "96", "--n-dev", "40"])
    configs: list[dict[str, Any]] = [
        numerics_config(data, steps=args.steps, eval_every_steps=args.steps, prec=args.prec, seed=seed,
                        dropout=0.1)
        for seed in range(1, args.jobs + 1)
    ]  # fmt: skip

    def folder(mode: str, n: int) -> Path:
        run_dir = root / mode / str(n)
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(configs[n]))
        return run_dir

    cache = BaseCache()
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    for n in range(args.jobs):
        run_dir = folder("sequential", n)
        assert run_attempt(run_dir, run_dir / "config.yaml", cache).exit_code == 0
        cache.release()
    seconds["sequential"] = time.perf_counter() - started
    ends: list[int] = []
    specs = [MemberSpec(d, d / "config.yaml", done=ends.append) for d in (folder("fused", n) for n in range(args.jobs))]
    waves = [specs]
    started = time.perf_counter()
    FusedTrainer(cache).run(lambda idle: waves.pop() if waves else None)
    seconds["fused"] = time.perf_counter() - started
    assert ends == [0] * args.jobs, ends
    pairs = [zip(losses(root / "fused" / str(n)), losses(root / "sequential" / str(n)), strict=True)
             for n in range(args.jobs)]  # fmt: skip
    worst = max(abs(a - b) / abs(b) for pair in pairs for a, b in pair)
    print(f"{args.jobs} jobs x {args.steps} steps, {args.prec}, 1 thread: sequential {seconds['sequential']:.1f} s, "
          f"fused {seconds['fused']:.1f} s ({seconds['fused'] / seconds['sequential']:.2f}x); "
          f"largest relative loss difference {worst:.2e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
