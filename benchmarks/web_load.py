"""Response time of every page of `orch web` over a state.db of 10,000 jobs.

    python -m benchmarks.web_load [--jobs 10000] [--repeat 5]

Builds a synthetic sweep in a temp dir (jobs over 7 GPUs with their attempts, one in ten
OOM'd once and retried, run dirs with result.json and progress.jsonl, events, a full memory
sample table), serves it with uvicorn on a free local port, and prints each page's time over
real HTTP once the server is up (it reads every result.json once at start, timed apart): the
first request and the median of the next --repeat.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from orchestrator.lifecycle import AttemptOutcome, JobState
from orchestrator.rundir_files import RunDir
from orchestrator.store.bulk_history import PastAttempt, PastEvent, PastJob, write_history
from orchestrator.store.db import Store
from orchestrator.store.gpu_samples import MAX_ROWS_PER_GPU, GpuSample
from orchestrator.store.web_queries import sweep_counts

GPUS = 7
CARD_MIB = 24 * 1024
TASKS = ("glue-tvt_qnli", "glue-tvt_rte", "glue-tvt_sst2", "glue-tvt_mrpc")
GOAL_S = 0.5


def build_sweep(db_path: Path, n_jobs: int, *, running: int = 14, queued: int = 200, seed: int = 0) -> None:
    """A state.db with `n_jobs` jobs: `running` running, `queued` queued, the rest succeeded
    (one in ten after an OOM'd first attempt). Run dirs sit beside the database."""
    rng = random.Random(seed)
    runs = db_path.parent / "runs"
    t_start = time.time() - 3600 * 24
    jobs: list[PastJob] = []
    attempts: list[PastAttempt] = []
    events: list[PastEvent] = []
    gpu_clock = [t_start] * GPUS
    attempt_id = 0
    for job_id in range(1, n_jobs + 1):
        config, task, jseed = f"c{job_id % 44:02d}", TASKS[job_id % len(TASKS)], job_id // 176
        state = JobState.SUCCEEDED
        if job_id > n_jobs - queued:
            state = JobState.QUEUED
        elif job_id > n_jobs - queued - running:
            state = JobState.RUNNING
        ts = t_start
        jobs.append(PastJob(
            job_id, f"id{job_id}", "E1", config, f"configs/E1/{config}.yaml", jseed, task, "sim", 8192, state, ts,
            max_attempts=8, hang_timeout_s=3600.0,
            wait_reason="GPU 0: 2.0 GiB free, needs 9.1 GiB" if state is JobState.QUEUED else None,
        ))  # fmt: skip
        events.append(
            PastEvent(
                ts,
                job_id,
                None,
                "submitted",
                None,
                "queued",
                f"queued E1/{config} seed {jseed} on {task}",
            )
        )
        if state is JobState.QUEUED:
            continue
        n_attempts = 2 if job_id % 10 == 0 else 1
        for n in range(1, n_attempts + 1):
            attempt_id += 1
            gpu = rng.randrange(GPUS)
            started = gpu_clock[gpu] + rng.uniform(0, 5)
            duration = rng.uniform(60, 240) if n == n_attempts else rng.uniform(10, 30)
            live = state is JobState.RUNNING and n == n_attempts
            gpu_clock[gpu] = started + duration / 2  # about two attempts share a card at a time
            outcome = None if live else (AttemptOutcome.OOM if n < n_attempts else AttemptOutcome.SUCCEEDED)
            run_dir = runs / "E1" / f"{job_id:06d}" / f"attempt-{n}"  # the real layout
            run_dir.mkdir(parents=True)
            if outcome is AttemptOutcome.SUCCEEDED:
                RunDir(run_dir).result.write_text(json.dumps(
                    {"status": "succeeded", "metrics": {"test": {"accuracy": 0.8 + rng.gauss(0, 0.02), "f1": 0.7}}}))
            RunDir(run_dir).progress.write_text("".join(
                json.dumps({"step": s, "total": 50, "loss": 2 / (1 + 0.1 * s)}) + "\n" for s in range(1, 51)))
            RunDir(run_dir).log.write_text("step 50/50 loss 0.33\n" * 200)
            attempts.append(PastAttempt(
                attempt_id, job_id, n, gpu, f"GPU-{gpu:04d}", n - 1, str(run_dir), predicted_peak_mib=9000,
                held_mib=8000 if live else 0, peak_mib=9500, started_at=started,
                ended_at=None if live else started + duration, outcome=outcome, reason=None if live else "done",
                progress={"step": 20, "total": 50, "loss": 0.7} if live else None,
            ))  # fmt: skip
            events.append(
                PastEvent(
                    started,
                    job_id,
                    attempt_id,
                    "start",
                    "queued",
                    "running",
                    f"attempt {n} started on GPU {gpu}",
                )
            )
            if outcome is not None:
                to = "queued" if outcome is AttemptOutcome.OOM else "succeeded"
                data = (
                    {"retry": {"from_level": 0, "to_level": 1, "why": "oom"}}
                    if outcome is AttemptOutcome.OOM
                    else None
                )
                events.append(PastEvent(started + duration, job_id, attempt_id, f"end:{outcome.value}", "running", to,
                                        f"attempt {n} {outcome.value}", data))
    gpus: list[dict[str, Any]] = [
        {"index": g, "uuid": f"GPU-{g:04d}", "name": "Simulated 24GiB", "total_mib": CARD_MIB, "used_mib": 18000,
         "free_mib": CARD_MIB - 18000, "utilization_pct": None, "processes": []} for g in range(GPUS)
    ]
    # ours split between two jobs per sample, a new pair every 20 samples: a card's chart has ~100 jobs
    samples = [
        GpuSample(
            t_start + i * 43.0,
            g,
            f"GPU-{g:04d}",
            CARD_MIB,
            15000 + (i * 37 % 8000),
            12000 + (i * 29 % 3000),
            CARD_MIB - 15000 - (i * 37 % 8000),
            {
                1 + (g * 997 + i // 20) % n_jobs: 6000,
                1 + (g * 991 + i // 20 + 7) % n_jobs: 6000 + (i * 29 % 3000),
            },
        )
        for g in range(GPUS)
        for i in range(MAX_ROWS_PER_GPU)
    ]
    with Store(db_path) as store:
        write_history(store, jobs, attempts, events, samples, gpus=gpus, heartbeat_at=time.time())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        size = len(response.read())
    return time.perf_counter() - started, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import uvicorn

    from orchestrator.web.app import create_app

    with tempfile.TemporaryDirectory() as tmp:
        db_path = Path(tmp) / "state.db"
        t0 = time.perf_counter()
        build_sweep(db_path, args.jobs)
        with Store(db_path) as store:
            n_attempts = sweep_counts(store).attempts
        print(f"built {args.jobs} jobs, {n_attempts} attempts, {GPUS} GPUs in {time.perf_counter() - t0:.1f} s")
        from orchestrator.results.collect import RunReader
        from orchestrator.web.results_view import result_table

        started = time.perf_counter()
        with Store(db_path) as store:
            result_table(store, RunReader())
        print(f"reading every result.json once (what the server does at start): {time.perf_counter() - started:.3f} s")
        port = _free_port()
        app = create_app(db_path, "benchmark")
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        started = time.perf_counter()
        while not app.state.results_warmed.wait(0.05):
            pass  # uvicorn starting in its thread, then the start-up read
        print(f"server up and results read {time.perf_counter() - started:.3f} s after start")
        pages = ["/", "/jobs", "/jobs?state=succeeded&config=c01", "/timeline", "/memory", f"/job/{args.jobs // 2}",
                 "/curves?config=c01", "/results", "/results.csv", "/fragment/overview", "/fragment/timeline",
                 "/fragment/results", "/static/uPlot.iife.min.js"]
        print(f"{'page':<36}{'first (s)':>10}{'median (s)':>12}{'KiB':>8}  goal < {GOAL_S} s")
        worst = 0.0
        for page in pages:
            first, size = _get(f"http://127.0.0.1:{port}{page}")
            times = [_get(f"http://127.0.0.1:{port}{page}")[0] for _ in range(args.repeat)]
            median = statistics.median(times)
            worst = max(worst, first, median)
            print(
                f"{page:<36}{first:>10.3f}{median:>12.3f}{size / 1024:>8.0f}  "
                f"{'ok' if max(first, median) < GOAL_S else 'SLOW'}"
            )
        print(f"slowest: {worst:.3f} s ({'within' if worst < GOAL_S else 'over'} the {GOAL_S} s goal)")
        server.should_exit = True
        thread.join(timeout=10)
        from orchestrator.web.report import render_report

        started = time.perf_counter()
        with Store(db_path) as store:
            html = render_report(store)
        print(f"orch report: {time.perf_counter() - started:.3f} s, {len(html.encode()) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
