"""What following a worker's stdout.log costs the daemon per pass, on a log of a given size.

    python -m benchmarks.stdout_follow [--log-mib 512]

Writes a log of noise (tqdm-style redraws) of that size, then times the follower's first look
(a daemon meeting the attempt: it reads only the tail) and passes that each find a few KiB new.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from orchestrator.attempts.stdout_follow import OutputFollower
from orchestrator.rundir_files import RunDir

REDRAW = "\r 45%|####5     | {n}/100000 [00:09<00:11, 4.9it/s, loss=0.41]"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-mib", type=int, default=512)
    parser.add_argument("--passes", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        log = RunDir(run_dir).log
        block = "".join(REDRAW.format(n=n) for n in range(1000)).encode()
        with open(log, "wb") as handle:
            for _ in range(args.log_mib * 1024 * 1024 // len(block)):
                handle.write(block)
        follower = OutputFollower()
        started = time.perf_counter()
        first = follower.progress(1, run_dir, None)
        first_ms = (time.perf_counter() - started) * 1000
        passes_ms = []
        with open(log, "a") as handle:
            for n in range(args.passes):
                handle.write("".join(REDRAW.format(n=1000 + 40 * n + k) for k in range(40)))
                handle.flush()
                started = time.perf_counter()
                last = follower.progress(1, run_dir, None)
                passes_ms.append((time.perf_counter() - started) * 1000)
        size_mib = log.stat().st_size / 2**20
    print(f"log {size_mib:.0f} MiB; first look {first_ms:.2f} ms (step {first and first.get('step')})")
    print(
        f"{args.passes} passes with ~{40 * len(REDRAW.format(n=12345)) / 1024:.1f} KiB new each: "
        f"median {statistics.median(passes_ms):.3f} ms, max {max(passes_ms):.3f} ms (step {last and last.get('step')})"
    )


if __name__ == "__main__":
    main()
