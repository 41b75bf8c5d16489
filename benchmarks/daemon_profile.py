"""Where the daemon's CPU goes: cProfile of a real daemon (in this process) on sim GPUs.

    python -m benchmarks.daemon_profile --queued 10000 [--scenario busy|handoff] [--window-s 20]
        [--out FILE.prof] [--top 30]

`fill`: 8 cards x 8 slots, from the daemon's first pass until 64 windows are open. `busy`: the
same, workers that run for an hour; the profile covers the passes and the waits between them
from the first pass once all 64 wrappers run, while nothing can start. `handoff`:
8 cards x 5 slots, workers of 3-7 s, so slots free all the time; the profile covers the same loop while
the queue drains into them. Prints the top functions by cumulative and by own time, the
process CPU seconds of the window, and the number of passes.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from benchmarks.daemon_scale import Bench, orch


def _daemon(bench: Bench, poll_s: float, on_pass: Callable[[], None], figures: dict[str, Any],
            counting: Callable[[], bool]) -> Any:
    """A daemon of the bench's state.db, in this process, that calls `on_pass` before each pass
    and, while `counting()`, records each pass's CPU in `figures`."""
    os.environ.update(bench.env)
    from orchestrator.cli.daemon.setup import make_daemon_executor, resolve_backend
    from orchestrator.daemon.loop import Daemon, DaemonSettings
    from orchestrator.daemon.options import DaemonOptions

    class ProfiledDaemon(Daemon):
        def tick(self, only: Collection[Path] | None = None) -> bool:
            on_pass()
            started = time.thread_time()
            try:
                return super().tick(only=only)
            finally:
                if counting():
                    figures["ticks"] += 1
                    figures["quick"] += only is not None
                    figures["quick_cpu_s" if only is not None else "full_cpu_s"].append(time.thread_time() - started)

    probe, worker_env = resolve_backend(bench.db, None)
    executor = make_daemon_executor(DaemonOptions(executor_kind="tmux", db_path=bench.db), probe)
    return ProfiledDaemon(DaemonSettings(db_path=bench.db, poll_s=poll_s, order="fifo"), probe, executor, worker_env)


def profile(
    root: Path, queued: int, scenario: str, window_s: float, poll_s: float
) -> tuple[cProfile.Profile, dict[str, Any]]:
    busy = scenario in ("busy", "fill")
    bench = Bench(root, "8x80GiB", job_s=3600 if busy else 5.0, spread=not busy)
    bench.queue(queued)
    orch(bench.env, "plan", "set", "8" if busy else "5")
    slots = 64 if busy else 40
    profiler = cProfile.Profile(time.thread_time)  # CPU time of the loop: the machine is shared
    armed = threading.Event()
    figures: dict[str, Any] = {"ticks": 0, "quick": 0, "quick_cpu_s": [], "full_cpu_s": []}
    state = {"on": False, "cpu0": 0.0, "wall0": 0.0}

    def start_when_armed() -> None:
        # on the daemon's own thread: a cProfile profiler sees only the thread that enabled it
        if armed.is_set() and not state["on"]:
            state.update(on=True, cpu0=time.process_time(), wall0=time.monotonic())
            profiler.enable()

    daemon = _daemon(bench, poll_s, start_when_armed, figures, lambda: bool(state["on"]))

    def watch() -> None:
        deadline = time.monotonic() + 300
        if scenario == "fill":  # from the first pass until every slot's window is open
            armed.set()
            while bench.attempts().launched < slots:
                time.sleep(0.02)
            daemon.request_stop()
            return
        while len(bench.pid_files()) < slots and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3 * poll_s)  # the pass that saw the last start is over
        armed.set()
        time.sleep(window_s)
        daemon.request_stop()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        daemon.run()
    finally:
        profiler.disable()
        figures["cpu_s"] = time.process_time() - state["cpu0"]  # the tee'd process: watcher included
        figures["wall_s"] = time.monotonic() - state["wall0"]
        bench.stop()
    figures["attempts"] = bench.attempts().claimed
    return profiler, figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--scenario", choices=("busy", "handoff", "fill"), default="busy")
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None, help="also write the raw profile here")
    args = parser.parse_args()
    # the workers of the stopped tmux server may still be writing their exit records
    with tempfile.TemporaryDirectory(prefix="orch-prof-", ignore_cleanup_errors=True) as tmp:
        profiler, figures = profile(Path(tmp) / "bench", args.queued, args.scenario, args.window_s, args.poll)
    if args.out:
        profiler.dump_stats(args.out)
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    print(
        f"{args.scenario}, {args.queued:,} queued: {figures['ticks']} passes ({figures['quick']} "
        f"after a poke), process CPU {figures['cpu_s']:.2f} s "
        f"in {figures['wall_s']:.1f} s wall ({100 * figures['cpu_s'] / max(figures['wall_s'], 1e-9):.2f} % of a core), "
        f"{figures['attempts']} attempts in all; load average {os.getloadavg()[0]:.2f}"
    )
    for kind in ("full", "quick"):
        cpu = sorted(figures[f"{kind}_cpu_s"])
        if cpu:  # profiled: cProfile's own overhead is in these
            print(
                f"  {kind} passes: {len(cpu)}, CPU median {1000 * cpu[len(cpu) // 2]:.1f} ms, max "
                f"{1000 * cpu[-1]:.1f} ms"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
