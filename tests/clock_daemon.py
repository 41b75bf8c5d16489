"""A real daemon in the test's own process, ticked by the test, on a clock the test moves.

Everything but time is real: state.db, the sim GPUs, the wrapper and its process group, the
subprocess launcher. Time-driven rules (hang timeout, kill grace, head-of-line hold, crash-loop
window) are reached by `clock.advance`, not by waiting; ticks are run until a condition holds,
under a real-time deadline."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from e2e_helpers import REPO_ROOT, Orch, wait_until
from hostile_helpers import hostile_command

from orchestrator.cli import main
from orchestrator.clock import FakeClock
from orchestrator.daemon.loop import Daemon, DaemonSettings
from orchestrator.executors.subprocesses import SubprocessExecutor
from orchestrator.gpu.sim import make_sim_probe
from orchestrator.store.attempts import last_attempt_id
from orchestrator.store.rows import Attempt

T = TypeVar("T")


class ClockDaemon:
    def __init__(self, orch: Orch, daemon: Daemon, clock: FakeClock) -> None:
        self.orch, self.daemon, self.clock = orch, daemon, clock

    def tick_until(self, condition: Callable[[], T | None], deadline_s: float = 30.0, what: str = "the condition") -> T:
        """Run passes until `condition` holds (each pass, then the condition)."""
        def step() -> T | None:
            self.daemon.tick()
            return condition()
        return wait_until(step, deadline_s, what)

    def cli(self, *args: str) -> None:
        """`orch ARGS` in this process (no interpreter start), against the same state.db."""
        rc = main(list(args))
        assert rc == 0, f"orch {' '.join(args)} exited {rc}"

    def submit(self, suite: str, pairs: str) -> None:
        self.cli("submit", "--suite", suite, "--pairs", pairs)

    def tick_while(self, invariant: Callable[[], object], real_s: float) -> None:
        """Run passes for `real_s` of real time, failing as soon as `invariant` stops holding:
        a negative (nothing happens) needs some time to be seen; the clock stands still."""
        deadline = time.monotonic() + real_s
        while time.monotonic() < deadline:
            self.daemon.tick()
            assert invariant(), "the invariant stopped holding"
            time.sleep(0.05)  # passes spread over the span, as the daemon's own would be

    def ticks(self, n: int) -> None:
        for _ in range(n):
            self.daemon.tick()

    def attempt(self, job_id: int) -> Attempt:
        """The job's latest attempt (the job has started)."""
        rows = self.orch.attempt_rows(job_id)
        assert rows, f"job {job_id} has no attempt"
        return rows[-1]

    def running(self, job_id: int) -> Attempt | None:
        """The job's live attempt once its wrapper recorded itself (pid.json) and its group is known."""
        rows = [a for a in self.orch.attempt_rows(job_id) if a.outcome is None and a.pgid is not None]
        return rows[0] if rows and (Path(rows[0].run_dir) / "pid.json").exists() else None


@contextlib.contextmanager
def clock_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: str = "2x24GiB",
                 starvation_s: float = 600.0) -> Iterator[ClockDaemon]:
    orch = Orch(tmp_path, gpus=gpus)
    for name in ("ORCH_DB", "ORCH_PLANS", "ORCH_GPU_BACKEND", "ORCH_SIM_GPUS", "ORCH_SIM_DIR", "PYTHONPATH"):
        monkeypatch.setenv(name, orch.env[name])  # what the workers inherit: this checkout, the sim GPUs
    monkeypatch.delenv("ORCH_SIM_FOREIGN", raising=False)
    monkeypatch.chdir(tmp_path)
    sim_dir = Path(orch.env["ORCH_SIM_DIR"])
    sim_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    clock = FakeClock()
    worker_env = {k: orch.env[k] for k in ("ORCH_GPU_BACKEND", "ORCH_SIM_DIR", "ORCH_SIM_GPUS")}
    daemon = Daemon(DaemonSettings(db_path=orch.db, poll_s=0.05, starvation_s=starvation_s),
                    make_sim_probe(sim_dir), SubprocessExecutor(), worker_env, clock=clock)
    daemon.started_at_s = clock.now_s()
    daemon.watcher.adopted_up_to_id = last_attempt_id(daemon.store)  # as Daemon.run() does
    daemon._register()  # `orch cancel` sees a live daemon and leaves the stopping to it
    try:
        yield ClockDaemon(orch, daemon, clock)
    finally:
        orch.kill_leftover_groups()  # what the test left running
        with contextlib.suppress(Exception):
            daemon.probe.close()
            daemon.store.close()
        os.chdir(REPO_ROOT)


HOLD = {"corrupt": "none", "hold_s": 600}  # a worker that starts, says nothing and stays


def big_job_waiting(d: ClockDaemon) -> None:
    """One 32 GiB card: job 1 (8 GiB) runs, job 2 (28 GiB) cannot fit beside it and waits, job 3
    (8 GiB) backfills beside job 1 while job 2 has not waited long."""
    # silent workers, with no hang timeout: moving the clock must not end them as hung; each job
    # its own model, so its own memory family (a silent job of an unmeasured family keeps the rest
    # of its family back until it ends: probing, which is not what is tested)
    for name, mem_gib in (("small", 8), ("big", 28), ("other", 8), ("third", 8)):
        d.orch.write_suite(name, {name: {**HOLD, "model": f"{name}-model"}}, worker=hostile_command(),
                           mem_gib=mem_gib, hang_timeout_s="off")
    d.cli("plan", "set", "4")
    d.submit("small", "1:a")
    d.tick_until(lambda: d.running(1), what="job 1 running")
    d.submit("big", "1:a")
    d.submit("other", "1:b")
    d.tick_until(lambda: d.running(3), what="job 3 to backfill")
    assert d.orch.job_states()[2] == "queued"
