"""A trace whose late OOMs test resuming: a shipped trace with one job in `--every` (seeded
choice) dying of an OOM at `--at` of its work at level 0 (an evaluation's spike that the
checkpointing rung removes), whatever its neighbours.

`python -m benchmarks.packing.gen_late_oom_trace --base benchmarks/traces/foreign_4x48.yaml --seed 3 \\
    > benchmarks/traces/late_oom_4x48.yaml`
"""

from __future__ import annotations

import argparse
import random
import sys

import yaml


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.packing.gen_late_oom_trace", description=__doc__)
    parser.add_argument("--base", required=True, help="trace YAML to start from")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--every", type=int, default=4, help="one job in this many dies late")
    parser.add_argument("--at", type=float, default=0.8, help="fraction of its work at which it dies")
    args = parser.parse_args(argv)
    if not 0.0 < args.at < 1.0 or args.every < 1:
        print("--at must be in (0, 1) and --every at least 1", file=sys.stderr)
        return 2
    with open(args.base) as f:
        raw = yaml.safe_load(f)
    rng = random.Random(args.seed)
    for job in raw["jobs"]:
        if rng.randrange(args.every) == 0:
            job["late_oom_at"] = args.at
            job["late_oom_levels"] = 1
    print(f"# {args.base.rsplit('/', 1)[-1]} with late OOMs: one job in {args.every} (seed {args.seed}) dies at "
          f"{args.at:.0%} of its work at level 0 (gen_late_oom_trace)")
    print(yaml.safe_dump(raw, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
