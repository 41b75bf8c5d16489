"""Control-plane figures at a given queue size, on simulated GPUs (see daemon_figures.py).

Each figure is measured on a fresh state.db holding `queued` jobs of one small sim config:
- fill: daemon started on 8 cards x 8 slots with the whole queue waiting; from the daemon's
  start as it recorded it in state.db, time until 64 attempts are launched (window opened,
  recorded in state.db; polled every 20 ms), and until 64 wrappers have written pid.json (each wrapper and
  worker is a Python process starting on the same 2 cores, so this one measures the machine);
- waiting: then, with every slot busy (the workers run for an hour), once every attempt is
  past its first HOST_WARMUP_S (host RAM and CPU read at every pass), the daemon's CPU over a
  window, per tick, and its RSS;
- hand-off: 8 cards x 5 slots, workers of 0.6-1.4 x `handoff_job_s` (40 configs, spaced so
  that ends spread as a real sweep's do, queued seed-major; `--handoff-configs 1` ends the
  40 workers of each wave at the same moment, as earlier runs of this benchmark did, whose
  queue's head was one config's jobs); per card, the k-th attempt started after the first wave is
  paired with the k-th that ended there: its wrapper's start (pid.json) minus that end
  (exit.json), and, the daemon's own part, the attempt's claim in state.db minus that end;
  and the daemon's CPU over the window divided by the attempts it started then;
- wrapper start-up: CPU of a wrapper around /bin/true, beside a bare `python -c pass`;
- CLI: `orch jobs`, `orch jobs --json`, `orch status --once`, `orch status --json` on that
  state.db (wall time of the whole command, and its peak RSS).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import yaml

from orchestrator.attempts.resource_use import HOST_WARMUP_S
from orchestrator.daemon.state import tmux_socket_name
from orchestrator.plans import expand_jobs, load_suite, parse_pairs
from orchestrator.rundir_files import RunDir
from orchestrator.store import Store
from orchestrator.store.daemon_row import read_daemon
from orchestrator.store.jobs import submit_jobs
from orchestrator.store.sweep_attempts import AttemptCounts, all_attempts, attempt_counts

PAIRS_PER_SUBMIT = 2_000  # --pairs is bounded in length


def orch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )


def timed_orch(env: dict[str, str], *args: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one CLI command, output discarded."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall_s = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(
            f"orch {' '.join(args)} failed: {proc.stderr.read().decode(errors='replace') if proc.stderr else ''}"
        )
    return wall_s, usage.ru_maxrss / 1024.0  # Linux: KiB


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(poll_s)
    raise TimeoutError(f"timed out waiting for {what}")


def iso_s(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def spread_factors(n: int) -> tuple[float, ...]:
    """Run times of `n` configs as factors of the mean, 0.6-1.4: evenly spaced up to five
    (sums of grid points fall on the grid, 0.6 + 0.8 = 1.4, so waves end together), more
    spaced by the golden ratio's fractional parts, so that ends spread as a real sweep's do."""
    if n <= 1:
        return (1.0,)
    if n <= 5:
        return tuple(0.6 + 0.8 * i / (n - 1) for i in range(n))
    golden = (5 ** 0.5 - 1) / 2
    return tuple(round(0.6 + 0.8 * ((i * golden) % 1.0), 4) for i in range(n))


class Bench:
    """One state.db with its plans, sim GPUs and tmux socket under `root`."""

    def __init__(self, root: Path, gpus: str, job_s: float, spread: int = 1) -> None:
        self.root = root
        root.mkdir(parents=True)
        self.db = root / "state.db"
        plans = root / "plans"
        (plans / "suites").mkdir(parents=True)
        (plans / "configs" / "bench").mkdir(parents=True)
        factors = spread_factors(spread)
        configs = [f"quick{i}" for i in range(len(factors))]
        (plans / "suites" / "bench.yaml").write_text(
            yaml.safe_dump({"worker": "sim", "mem_gib": 1, "configs": configs, "hang_timeout_s": 7200})
        )
        for name, factor in zip(configs, factors, strict=True):
            (plans / "configs" / "bench" / f"{name}.yaml").write_text(
                yaml.safe_dump({"batch_size": 4, "sim_mem_gib": 1, "sim_seconds": job_s * factor, "sim_ramp_s": 0.1})
            )
        self.n_configs = len(configs)
        self.plans = plans
        self.env = {**os.environ, "ORCH_DB": str(self.db), "ORCH_GPU_BACKEND": "sim", "ORCH_SIM_GPUS": gpus,
                    "ORCH_PLANS": str(plans), "ORCH_SIM_DIR": str(root / "sim"), "ORCH_LAUNCHER": "tmux"}

    def queue(self, n_jobs: int) -> None:
        """Submit n jobs in-process (the CLI's own submit path, without a process per chunk)."""
        suite = load_suite("bench", self.plans)
        with Store(self.db) as store:
            n_pairs = -(-n_jobs // self.n_configs)  # each pair makes one job per config
            for start in range(0, n_pairs, PAIRS_PER_SUBMIT):
                seeds = range(start, min(n_pairs, start + PAIRS_PER_SUBMIT))
                pairs = parse_pairs(" ".join(f"{i}:glue_rte" for i in seeds))
                jobs = expand_jobs(suite, pairs, {}, None, 0)  # config-major
                # seed-major: the queue's head holds every run time, not one config's 2,000 jobs
                # (which made every worker of a wave end at the same moment)
                jobs = [jobs[c * len(pairs) + p] for p in range(len(pairs)) for c in range(self.n_configs)]
                submit_jobs(store, suite, jobs, allowed_gpus=None, priority=0, force=False, dry_run=False)

    def attempts(self) -> AttemptCounts:
        with Store(self.db) as store:
            return attempt_counts(store)

    def pid_files(self) -> list[Path]:
        return list((self.root / "runs").glob("*/*/attempt-*/pid.json"))

    def start_daemon(self, poll_s: float) -> psutil.Process:
        orch(self.env, "daemon", "start", "--poll", str(poll_s), "--order", "fifo")
        # its pid from state.db, not `orch daemon status`: a CLI process starting beside the
        # daemon's first launches took seconds on 2 cores, and every poll after it waited
        with Store(self.db) as store:
            row = read_daemon(store)
        if row is None or not row.pid:
            raise RuntimeError("the daemon did not record itself")
        return psutil.Process(row.pid)

    def stop(self) -> None:
        subprocess.run([sys.executable, "-m", "orchestrator", "daemon", "stop"], env=self.env,
                       capture_output=True, check=False)
        subprocess.run(["tmux", "-L", tmux_socket_name(self.db), "kill-server"], capture_output=True, check=False)


def fill_and_wait(root: Path, queued: int, idle_s: float, poll_s: float, cli: bool = True) -> dict[str, Any]:
    """64 slots filled from a queue of `queued`, then the daemon while nothing can start."""
    bench = Bench(root, "8x80GiB", job_s=3600)
    bench.queue(queued)
    orch(bench.env, "plan", "set", "8")
    try:
        proc = bench.start_daemon(poll_s)
        # one connection for the polls: opening a Store for each took longer than a launch on
        # 2 cores while 64 interpreters started, and measured the poll instead of the daemon
        with Store(bench.db) as poll:
            wait_for(lambda: attempt_counts(poll).launched >= 64, 120, "64 launches", poll_s=0.02)
        launched_at = time.time()
        cpu_launched = proc.cpu_times()
        launch_cpu_s = cpu_launched.user + cpu_launched.system  # from its start: imports included
        wait_for(lambda: len(bench.pid_files()) >= 64, 120, "64 workers")
        starts = sorted(iso_s(json.loads(p.read_text())["started_at"]) for p in bench.pid_files())
        with Store(bench.db) as store:
            daemon = read_daemon(store)
        if daemon is None or daemon.started_at is None:
            raise RuntimeError("the daemon did not record its start")
        started = daemon.started_at
        fill_s = starts[63] - started
        launch_s = launched_at - started
        # past every attempt's first HOST_WARMUP_S, while the daemon reads host RAM and CPU at
        # every pass: the window measures waiting, not the sweep's start
        time.sleep(max(3 * poll_s, HOST_WARMUP_S + poll_s))
        before, wall_before = proc.cpu_times(), time.monotonic()
        time.sleep(idle_s)  # the measurement window
        after, wall_after = proc.cpu_times(), time.monotonic()
        rss_mib = proc.memory_info().rss / 2**20
        window_s = wall_after - wall_before
        cpu_s = (after.user - before.user) + (after.system - before.system)
        running = bench.attempts().live
    finally:
        bench.stop()
    figures = cli_figures(bench) if cli else {}
    return {
        "queued": queued,
        "fill_64_s": fill_s,
        "launch_64_s": launch_s,
        "launch_64_daemon_cpu_s": launch_cpu_s,
        "waiting": {"window_s": round(window_s, 1), "poll_s": poll_s, "running": running,
                    "cpu_percent_of_one_core": 100.0 * cpu_s / window_s,
                    "cpu_per_tick_s": cpu_s / (window_s / poll_s), "rss_mib": rss_mib},
        "cli": figures,
    }


def cli_figures(bench: Bench, repeats: int = 3) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for name, args in (("jobs", ("jobs",)), ("jobs_json", ("jobs", "--json")),
                       ("status_once", ("status", "--once")), ("status_json", ("status", "--json"))):
        runs = [timed_orch(bench.env, *args) for _ in range(repeats)]
        figures[name] = {"median_s": statistics.median(r[0] for r in runs), "max_rss_mib": max(r[1] for r in runs)}
    return figures


def status_at(root: Path, jobs: int) -> dict[str, Any]:
    """`orch status --once` (and the CLI's other reads) on a state.db of `jobs` queued jobs."""
    bench = Bench(root, "8x80GiB", job_s=1)
    bench.queue(jobs)
    return {"n_jobs": jobs, **cli_figures(bench)}


HANDOFF_CONFIGS = 40  # run times spread over 0.6-1.4 x job_s (spread_factors)


def handoff(root: Path, queued: int, window_s: float, job_s: float, poll_s: float,
            configs: int = HANDOFF_CONFIGS) -> dict[str, Any]:
    """Slot freed -> next worker running, 40 slots busy with a queue of `queued` behind them;
    `configs`: how many run times (1: all 40 end together, wave after wave)."""
    bench = Bench(root, "8x80GiB", job_s=job_s, spread=configs)
    bench.queue(queued)
    orch(bench.env, "plan", "set", "5")
    try:
        proc = bench.start_daemon(poll_s)
        wait_for(lambda: len(bench.pid_files()) >= 40, 120, "40 workers")
        attempts_before, cpu_before = bench.attempts().claimed, proc.cpu_times()
        time.sleep(window_s)
        cpu_after = proc.cpu_times()
        started_in_window = bench.attempts().claimed - attempts_before
    finally:
        bench.stop()
    daemon_cpu_s = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    ends: dict[int, list[float]] = defaultdict(list)
    starts: dict[int, list[float]] = defaultdict(list)
    with Store(bench.db) as store:
        attempts = all_attempts(store)
    claims: dict[int, list[float]] = defaultdict(list)
    for attempt in attempts:
        run_dir = Path(attempt.run_dir)
        try:
            pid_record = json.loads(RunDir(run_dir).pid.read_text())
        except (OSError, ValueError):
            continue
        starts[attempt.gpu_index].append(iso_s(pid_record["started_at"]))
        claims[attempt.gpu_index].append(attempt.started_at)
        with contextlib.suppress(OSError, ValueError, KeyError):
            ends[attempt.gpu_index].append(iso_s(json.loads(RunDir(run_dir).exit.read_text())["ended_at"]))
    latencies: list[float] = []
    daemon_part: list[float] = []
    for gpu, gpu_starts in starts.items():
        later = sorted(gpu_starts)[5:]  # the first wave filled the card's 5 slots
        for started, claimed, ended in zip(later, sorted(claims[gpu])[5:], sorted(ends[gpu]), strict=False):
            latencies.append(started - ended)
            daemon_part.append(claimed - ended)
    latencies.sort()
    daemon_part.sort()
    if not latencies:
        raise RuntimeError("no hand-off observed: lengthen the window")
    return {
        "queued": queued, "handoffs": len(latencies), "job_s": job_s, "poll_s": poll_s,
        "median_s": statistics.median(latencies),
        "p99_s": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "max_s": latencies[-1],
        "claim_median_s": statistics.median(daemon_part),
        "claim_p99_s": daemon_part[min(len(daemon_part) - 1, int(0.99 * len(daemon_part)))],
        # every pass of the window (periodic ones too) over the attempts it started
        "daemon_cpu_per_start_s": daemon_cpu_s / max(1, started_in_window),
        "window_s": window_s, "started_in_window": started_in_window,
    }


def wrapper_start_cpu(root: Path, runs: int = 7) -> dict[str, float]:
    """CPU seconds (user + system) of one wrapper around `/bin/true`: the interpreter start-up
    and imports every attempt pays before its worker starts; median of `runs`."""
    from orchestrator.executors.wrapper.run import wrapper_argv

    samples = []
    for i in range(runs):
        run_dir = root / "runs" / "s" / "j" / f"attempt-{i}"
        run_dir.mkdir(parents=True)
        proc = subprocess.Popen(
            wrapper_argv(run_dir, ["/bin/true"]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _, _, usage = os.wait4(proc.pid, 0)
        samples.append(usage.ru_utime + usage.ru_stime)
    bare = []
    for _ in range(runs):
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        _, _, usage = os.wait4(proc.pid, 0)
        bare.append(usage.ru_utime + usage.ru_stime)
    return {"wrapper_cpu_s": statistics.median(samples), "bare_python_cpu_s": statistics.median(bare)}


def load_note() -> str:
    """The machine's load average at the time, for the record: other work shares the cores."""
    one, five, _ = os.getloadavg()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (
        f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores; bench self "
        f"CPU {usage.ru_utime:.0f} s"
    )
