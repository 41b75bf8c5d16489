"""What keeping every attempt's metric history costs: the daemon's pass, the database, a read.

    python -m benchmarks.metric_history [--steps 20000] [--per-pass 10] [--jobs 100]

A LoRA-like worker appends a progress.jsonl line per optimizer step (loss, lr, grad_norm, and
val metrics every 200 steps); the history follower reads `--per-pass` new steps a pass, as the
daemon does, until `--steps`. Prints the pass time (median and 99th percentile), the rows kept
per key (bounded: a key past 2,000 points is thinned to 1,000), the database size, and the time
to read every point of `--jobs` such attempts (`orch curves`' reader).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from orchestrator.api.curves import curve_points
from orchestrator.attempts.history_follow import HistoryFollower
from orchestrator.lifecycle import AttemptOutcome, JobState
from orchestrator.rundir_files import RunDir
from orchestrator.store.bulk_history import PastAttempt, PastJob, write_history
from orchestrator.store.db import Store
from orchestrator.store.history import record_history
from orchestrator.store.history_bounds import Point


def _line(step: int) -> str:
    record: dict[str, object] = {
        "t": 1.0 * step,
        "step": step,
        "total": 10**6,
        "loss": 2.0 / (1 + 0.01 * step) + 0.1 * math.sin(step),
        "lr": 1e-4,
        "grad_norm": 1.0 + (step % 7) / 10,
        "samples_per_s": 50.0,
        "peak_mem_mib": 9000,
    }
    if step % 200 == 0:
        record["val"] = {"accuracy": 0.5 + step / 10**6, "f1": 0.4}
    return json.dumps(record) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--per-pass", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        db = root / "state.db"
        jobs = [PastJob(i, f"id{i}", "B", "c", "c.yaml", i, "rte", "lora", 1024, JobState.SUCCEEDED, 1.0,
                        max_attempts=3, hang_timeout_s=60.0) for i in range(1, args.jobs + 1)]  # fmt: skip
        attempts = [PastAttempt(i, i, 1, 0, "GPU-0", 0, str(root / f"a{i}"), 900, 0, 800, 2.0, 3.0,
                                AttemptOutcome.SUCCEEDED) for i in range(1, args.jobs + 1)]  # fmt: skip
        with Store(db) as store:
            write_history(store, jobs, attempts, [], [], gpus=[], heartbeat_at=4.0)
            run_dir = root / "a1"
            run_dir.mkdir()
            follower = HistoryFollower(store)
            passes_ms = []
            with open(RunDir(run_dir).progress, "a") as handle:
                for start in range(1, args.steps + 1, args.per_pass):
                    handle.write("".join(_line(s) for s in range(start, min(start + args.per_pass, args.steps + 1))))
                    handle.flush()
                    began = time.perf_counter()
                    follower.collect(1, run_dir)
                    passes_ms.append((time.perf_counter() - began) * 1000)
            one = [Point(p.step, p.key, p.value) for p in curve_points(store, jobs=[1])]
            counts = dict(Counter(p.key for p in one))
            for attempt in range(2, args.jobs + 1):  # the other jobs: a copy of the first one's history
                record_history(store, attempt, one)
        size_mib = db.stat().st_size / 2**20 + (
            Path(f"{db}-wal").stat().st_size / 2**20 if Path(f"{db}-wal").exists() else 0
        )
        with Store(db) as store:
            began = time.perf_counter()
            points = curve_points(store)
            read_s = time.perf_counter() - began
    passes_ms.sort()
    print(f"{args.steps} steps, {args.per_pass} a pass: pass median {statistics.median(passes_ms):.2f} ms, "
          f"p99 {passes_ms[int(len(passes_ms) * 0.99)]:.2f} ms, max {passes_ms[-1]:.2f} ms")
    print("rows kept per key: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    print(
        f"{args.jobs} such attempts: state.db {size_mib:.1f} MiB; reading their {len(points)} "
        f"points: {read_s * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
