"""Daemon overhead figures on simulated GPUs: dispatch latency, `orch status --once` with
10,000 jobs, idle daemon CPU; and by queue size (`--queued`, see daemon_scale.py): filling 64
slots, the daemon's CPU and RSS while nothing can start, slot hand-off, the CLI's reads.
Prints a table; `--json FILE` also writes the figures.

    python -m benchmarks.daemon_figures [--jobs 20] [--idle-s 30] [--queued 1000,10000,50000]
        [--json benchmarks/results/daemon.json]

Everything is real except the GPU memory: the daemon, tmux, SQLite, the wrapper and the sim
worker processes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from benchmarks import daemon_scale
from orchestrator.lifecycle import JobState
from orchestrator.plans import expand_jobs, load_suite, parse_pairs
from orchestrator.rundir_files import RunDir
from orchestrator.store import Store
from orchestrator.store.jobs import submit_jobs
from orchestrator.store.queries import get_attempts, get_job, job_ids_in_states, state_counts
from orchestrator.store.sweep_attempts import all_attempts


def _orch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )


def _write_plans(root: Path) -> Path:
    plans = root / "plans"
    (plans / "suites").mkdir(parents=True)
    (plans / "configs" / "bench").mkdir(parents=True)
    (plans / "suites" / "bench.yaml").write_text(
        yaml.safe_dump({"worker": "sim", "mem_gib": 1, "configs": ["quick"], "hang_timeout_s": 600})
    )
    (plans / "configs" / "bench" / "quick.yaml").write_text(
        yaml.safe_dump({"batch_size": 4, "sim_mem_gib": 1, "sim_seconds": 0.5, "sim_ramp_s": 0.1})
    )
    return plans


def _wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise TimeoutError(what)


def dispatch_latency(root: Path, n_jobs: int, poll_s: float) -> dict[str, Any]:
    """Submit jobs one at a time to an idle daemon; latency = pid.json's start - queued_at."""
    db = root / "lat" / "state.db"
    db.parent.mkdir()
    env = {**os.environ, "ORCH_DB": str(db), "ORCH_GPU_BACKEND": "sim", "ORCH_SIM_GPUS": "2x24GiB",
           "ORCH_PLANS": str(_write_plans(root / "lat"))}
    _orch(env, "plan", "set", "4")
    _orch(env, "daemon", "start", "--poll", str(poll_s))
    latencies: list[float] = []
    try:
        with Store(db) as store:
            for i in range(n_jobs):
                _orch(env, "submit", "--suite", "bench", "--pairs", f"{i}:glue_rte")
                job = get_job(store, job_ids_in_states(store, tuple(JobState))[-1])  # the one just submitted
                _wait(lambda job=job: bool(get_attempts(store, job.id)), 30, "start")
                run_dir = Path(get_attempts(store, job.id)[0].run_dir)
                _wait(lambda run_dir=run_dir: RunDir(run_dir).pid.exists(), 30, RunDir.PID)
                pid_record = json.loads(RunDir(run_dir).pid.read_text())
                started = pid_record.get("started_at")
                started_s = started if isinstance(started, (int, float)) else _iso_to_s(str(started))
                latencies.append(started_s - job.queued_at)
            # stopped with nothing running, the daemon takes its tmux server along
            _wait(lambda: not job_ids_in_states(store, (JobState.QUEUED, JobState.RUNNING)), 60, "sweep end")
    finally:
        _orch(env, "daemon", "stop")
    return {
        "jobs": n_jobs,
        "poll_s": poll_s,
        "median_s": statistics.median(latencies),
        "p90_s": sorted(latencies)[int(0.9 * (len(latencies) - 1))],
        "max_s": max(latencies),
    }


def slot_free_latency(root: Path, n_jobs: int, poll_s: float) -> dict[str, Any]:
    """One slot, a queue of short jobs: latency = next worker's start - previous worker's end."""
    db = root / "slot" / "state.db"
    db.parent.mkdir()
    env = {**os.environ, "ORCH_DB": str(db), "ORCH_GPU_BACKEND": "sim", "ORCH_SIM_GPUS": "1x24GiB",
           "ORCH_PLANS": str(_write_plans(root / "slot"))}
    _orch(env, "submit", "--suite", "bench", "--pairs", " ".join(f"{i}:glue_rte" for i in range(n_jobs)),
          "--gpu-plan", "1", "--gpus", "0")
    _orch(env, "daemon", "start", "--poll", str(poll_s), "--order", "fifo")
    try:
        with Store(db) as store:
            _wait(lambda: state_counts(store)[JobState.SUCCEEDED.value] == n_jobs, 60 + 5 * n_jobs, "sweep")
            run_dirs = [Path(a.run_dir) for a in sorted(all_attempts(store), key=lambda a: a.started_at)]
    finally:
        _orch(env, "daemon", "stop")
    latencies = []
    for previous, following in itertools.pairwise(run_dirs):
        ended = _iso_to_s(json.loads(RunDir(previous).exit.read_text())["ended_at"])
        started = _iso_to_s(json.loads(RunDir(following).pid.read_text())["started_at"])
        latencies.append(started - ended)
    return {"handoffs": len(latencies), "poll_s": poll_s, "median_s": statistics.median(latencies),
            "max_s": max(latencies)}


def _iso_to_s(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


def status_with_10k_jobs(root: Path) -> dict[str, Any]:
    db = root / "big" / "state.db"
    db.parent.mkdir()
    plans = _write_plans(root / "big")
    suite = load_suite("bench", plans)
    with Store(db) as store:
        for chunk in range(0, 10_000, 2_000):
            pairs = parse_pairs(" ".join(f"{i}:glue_rte" for i in range(chunk, chunk + 2_000)))
            submit_jobs(store, suite, expand_jobs(suite, pairs, {}, None, 0), allowed_gpus=None, priority=0,
                        force=False, dry_run=False)
    env = {**os.environ, "ORCH_DB": str(db)}
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        _orch(env, "status", "--once")
        timings.append(time.perf_counter() - started)
    json_timings = []
    for _ in range(3):
        started = time.perf_counter()
        _orch(env, "status", "--json")
        json_timings.append(time.perf_counter() - started)
    started = time.perf_counter()
    _orch(env, "--version")
    startup_s = time.perf_counter() - started
    return {
        "jobs": 10_000,
        "status_once_median_s": statistics.median(timings),
        "status_json_median_s": statistics.median(json_timings),
        "interpreter_and_import_s": startup_s,
    }


def idle_cpu(root: Path, idle_s: float, poll_s: float) -> dict[str, Any]:
    db = root / "idle" / "state.db"
    db.parent.mkdir()
    env = {**os.environ, "ORCH_DB": str(db), "ORCH_GPU_BACKEND": "sim", "ORCH_SIM_GPUS": "7x24GiB"}
    _orch(env, "daemon", "start", "--poll", str(poll_s))
    try:
        pid = json.loads(_orch(env, "daemon", "status", "--json").stdout)["pid"]
        proc = psutil.Process(pid)
        time.sleep(2.0)  # let start-up work settle before measuring
        before = proc.cpu_times()
        started = time.monotonic()
        time.sleep(idle_s)  # the measurement window
        after = proc.cpu_times()
        elapsed = time.monotonic() - started
    finally:
        _orch(env, "daemon", "stop")
    cpu_s = (after.user - before.user) + (after.system - before.system)
    return {"idle_s": round(elapsed, 1), "poll_s": poll_s, "cpu_percent_of_one_core": 100.0 * cpu_s / elapsed}


def _queue_sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",") if part.strip()]
    if not sizes or any(n < 100 for n in sizes):
        raise argparse.ArgumentTypeError("--queued: comma-separated queue sizes of at least 100")
    return sizes


def by_queue_size(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for n in args.queued:
        print(f"queue of {n:,} ...", file=sys.stderr, flush=True)
        row = daemon_scale.fill_and_wait(root / f"fill-{n}", n, args.waiting_s, args.poll, cli=not args.no_cli)
        if n <= args.handoff_max:
            row["handoff"] = daemon_scale.handoff(
                root / f"handoff-{n}",
                n,
                args.handoff_s,
                args.handoff_job_s,
                args.poll,
                configs=args.handoff_configs,
            )
        row["load"] = daemon_scale.load_note()
        rows[str(n)] = row
    status_big = daemon_scale.status_at(root / "status-big", args.status_jobs) if args.status_jobs else None
    return {"by_queue": rows, "status_big": status_big, "wrapper": daemon_scale.wrapper_start_cpu(root / "wrapper")}


def print_by_queue(data: dict[str, Any]) -> None:
    rows = data["by_queue"]
    sizes = list(rows)
    print()
    print("| figure | " + " | ".join(f"{int(n):,} queued" for n in sizes) + " | target |")
    print("|---|" + "---|" * len(sizes) + "---|")

    def line(name: str, fmt: Any, target: str) -> None:
        cells = []
        for n in sizes:
            try:
                cells.append(fmt(rows[n]))
            except KeyError:
                cells.append("–")
        print(f"| {name} | " + " | ".join(cells) + f" | {target} |")

    line(
        "daemon CPU, no slot free (% of a core)",
        lambda r: f"{r['waiting']['cpu_percent_of_one_core']:.2f} %",
        "< 2 %",
    )
    line("CPU per tick", lambda r: f"{1000 * r['waiting']['cpu_per_tick_s']:.1f} ms", "")
    line("daemon RSS", lambda r: f"{r['waiting']['rss_mib']:.0f} MiB", "< 150 MiB")
    line(
        "hand-off: slot freed -> next wrapper running, median / p99",
        lambda r: f"{r['handoff']['median_s']:.3f} / {r['handoff']['p99_s']:.3f} s",
        "< 0.2 / 0.5 s at 10k",
    )
    line(
        "of which the daemon's: slot freed -> attempt claimed, median / p99",
        lambda r: f"{r['handoff']['claim_median_s']:.3f} / {r['handoff']['claim_p99_s']:.3f} s",
        "",
    )
    line(
        "daemon CPU per attempt started, hand-off window",
        lambda r: f"{1000 * r['handoff']['daemon_cpu_per_start_s']:.0f} ms",
        "",
    )
    line("start -> 64 slots launched", lambda r: f"{r['launch_64_s']:.2f} s", "< 2 s")
    line("daemon CPU from its start to the 64th launch", lambda r: f"{r['launch_64_daemon_cpu_s']:.2f} s", "")
    line("start -> 64 wrappers running", lambda r: f"{r['fill_64_s']:.2f} s", "")
    line("orch jobs", lambda r: f"{r['cli']['jobs']['median_s']:.2f} s", "< 1 s at 10k")
    line(
        "orch jobs --json (peak RSS)",
        lambda r: (
            f"{r['cli']['jobs_json']['median_s']:.2f} s ({r['cli']['jobs_json']['max_rss_mib']:.0f} MiB)"
        ),
        "",
    )
    line("orch status --once", lambda r: f"{r['cli']['status_once']['median_s']:.2f} s", "")
    line(
        "orch status --json (peak RSS)",
        lambda r: (
            f"{r['cli']['status_json']['median_s']:.2f} s ({r['cli']['status_json']['max_rss_mib']:.0f} MiB)"
        ),
        "",
    )
    wrapper = data["wrapper"]
    print(
        f"\nwrapper start-up CPU: {1000 * wrapper['wrapper_cpu_s']:.0f} ms (bare python "
        f"{1000 * wrapper['bare_python_cpu_s']:.0f} ms)"
    )
    big = data["status_big"]
    if big is not None:
        print(
            f"orch status --once at {big['n_jobs']:,} jobs: {big['status_once']['median_s']:.3f} s (target < 0.3 s); "
            f"status --json {big['status_json']['median_s']:.2f} s, peak RSS "
            f"{big['status_json']['max_rss_mib']:.0f} MiB; "
            f"jobs --json {big['jobs_json']['median_s']:.2f} s, peak RSS {big['jobs_json']['max_rss_mib']:.0f} MiB"
        )
    for n in sizes:
        print(f"  {int(n):,} queued: {rows[n]['load']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--queued", type=_queue_sizes, default=None,
                        help="queue sizes for the by-size figures, e.g. 1000,10000,50000")
    parser.add_argument("--waiting-s", type=float, default=20.0, help="CPU window while no slot is free")
    parser.add_argument("--handoff-s", type=float, default=40.0, help="how long to watch hand-offs")
    parser.add_argument("--handoff-job-s", type=float, default=15.0, help="run time of each hand-off worker")
    parser.add_argument("--handoff-configs", type=int, default=daemon_scale.HANDOFF_CONFIGS,
                        help="run times of the hand-off workers (1: all 40 end together)")
    parser.add_argument("--handoff-max", type=int, default=10_000, help="largest queue to measure hand-off at")
    parser.add_argument(
        "--status-jobs",
        type=int,
        default=100_000,
        help="jobs for the big `status --once` figure (0: skip it)",
    )
    parser.add_argument("--no-cli", action="store_true", help="skip the CLI figures by queue size")
    parser.add_argument("--only-queued", action="store_true", help="skip the empty-queue figures")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    args = parser.parse_args()
    figures: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        root = Path(tmp)
        if not args.only_queued:
            figures.update({
                "dispatch_latency": dispatch_latency(root, args.jobs, args.poll),
                "slot_free_latency": slot_free_latency(root, 10, args.poll),
                "status_10k": status_with_10k_jobs(root),
                "idle_daemon": idle_cpu(root, args.idle_s, args.poll),
            })
        if args.queued:
            figures.update(by_queue_size(root, args))
    if not args.only_queued:
        lat, status, idle = figures["dispatch_latency"], figures["status_10k"], figures["idle_daemon"]
        print(
            f"dispatch latency (queued -> worker running), {lat['jobs']} jobs, poll {lat['poll_s']} s: "
            f"median {lat['median_s']:.3f} s, p90 {lat['p90_s']:.3f} s, max {lat['max_s']:.3f} s   "
            "(target: median < 1 s)"
        )
        slot = figures["slot_free_latency"]
        print(f"slot freed -> next worker running, {slot['handoffs']} hand-offs on one slot: "
              f"median {slot['median_s']:.3f} s, max {slot['max_s']:.3f} s")
        print(f"orch status --once, 10,000 jobs: median {status['status_once_median_s']:.3f} s "
              f"(of which interpreter + imports {status['interpreter_and_import_s']:.3f} s); "
              f"--json {status['status_json_median_s']:.3f} s   (target: < 0.5 s)")
        print(
            f"idle daemon, poll {idle['poll_s']} s, {idle['idle_s']} s: "
            f"{idle['cpu_percent_of_one_core']:.2f}% of one core   (target: < 2%)"
        )
    if args.queued:
        print_by_queue(figures)
    if args.json_path:
        args.json_path.parent.mkdir(parents=True, exist_ok=True)
        args.json_path.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
