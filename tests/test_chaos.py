"""Crash safety: the daemon SIGKILLed mid-sweep, the tmux server killed, hung workers, racing
submits, an unwritable runs dir, draining. Every job must end exactly once."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import psutil
import pytest
from e2e_helpers import Orch, group_alive, pid_alive, requires_tmux, wait_until

pytestmark = [requires_tmux, pytest.mark.tmux]

RESULTS_FILE = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "chaos.json"




class LiveSampler(threading.Thread):
    """Counts, per job, live attempt rows and live sim worker processes, over and over."""

    def __init__(self, orch: Orch) -> None:
        super().__init__(daemon=True)
        self.orch = orch
        self.stop = threading.Event()
        self.max_rows_per_job = 0
        self.max_workers_per_job = 0
        self.samples = 0
        self.runs = str(orch.root / "runs")

    def _workers_per_job(self) -> Counter[str]:
        jobs: Counter[str] = Counter()
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if cmdline[1:3] == ["-m", "workers.sim"] and "--run-dir" in cmdline:  # the worker, not its wrapper
                run_dir = cmdline[cmdline.index("--run-dir") + 1]
                with contextlib.suppress(psutil.NoSuchProcess):
                    if run_dir.startswith(self.runs) and proc.status() != psutil.STATUS_ZOMBIE:
                        jobs[str(Path(run_dir).parent)] += 1
        return jobs

    def run(self) -> None:
        while not self.stop.is_set():
            per_job = Counter(a.job_id for a in self.orch.live_attempts())
            self.max_rows_per_job = max(self.max_rows_per_job, *per_job.values(), 0)
            self.max_workers_per_job = max(self.max_workers_per_job, *self._workers_per_job().values(), 0)
            self.samples += 1
            self.stop.wait(0.05)


def _assert_exactly_once(orch: Orch, job_count: int) -> dict[str, int]:
    states = orch.job_states()
    assert len(states) == job_count
    assert Counter(states.values()) == {"succeeded": job_count}, Counter(states.values())
    attempts = orch.attempts()
    assert all(a["outcome"] is not None and a["ended_at"] is not None for a in attempts)
    successes = Counter(a["job_id"] for a in attempts if a["outcome"] == "succeeded")
    assert set(successes) == set(states)
    duplicates = sum(n - 1 for n in successes.values())
    assert duplicates == 0
    by_job: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for a in attempts:
        by_job[a["job_id"]].append(a)
    for rows in by_job.values():
        rows.sort(key=lambda a: a["started_at"])
        for before, after in itertools.pairwise(rows):
            assert before["ended_at"] <= after["started_at"], (before, after)
    return {"attempts": len(attempts), "duplicate_successes": duplicates,
            "lost_attempts": sum(a["outcome"] == "lost" for a in attempts)}


def _kill_daemon(orch: Orch) -> None:
    pid = orch.daemon_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), 10, "the daemon to die")


def _progress(orch: Orch) -> int:
    """Attempt starts plus ends so far: moves whenever the daemon does something."""
    attempts = orch.attempt_rows()
    return len(attempts) + sum(a.ended_at is not None for a in attempts)


@pytest.mark.slow
def test_daemon_sigkilled_repeatedly_every_job_once(orch: Orch) -> None:
    jobs, kills_wanted = 36, 6
    orch.write_suite("chaos", {"chaos": {"sim_mem_gib": 3, "sim_seconds": 2.5}}, mem_gib=4, max_attempts=8)
    orch.submit("chaos", " ".join(f"{seed}:glue_rte" for seed in range(jobs)), "--gpu-plan", "3,3")
    sampler = LiveSampler(orch)
    sampler.start()
    orch.start_daemon()
    rng = random.Random(1234)
    kills = 0
    while kills < kills_wanted and not orch.all_done():
        target = _progress(orch) + rng.randint(0, 2)  # a random moment: after 0-2 more attempt starts/ends
        wait_until(
            lambda t=target: _progress(orch) >= t or orch.all_done(), 60, "the sweep to move"
        )  # type: ignore[misc]
        if orch.all_done():
            break
        _kill_daemon(orch)
        kills += 1
        orch.start_daemon()
    orch.wait_all_done(180)
    sampler.stop.set()
    sampler.join()
    assert kills >= 5
    figures = _assert_exactly_once(orch, jobs)
    assert sampler.samples > 20
    assert sampler.max_rows_per_job == 1
    assert sampler.max_workers_per_job == 1
    report = {
        "daemon_sigkills_survived": kills,
        "jobs": jobs,
        "jobs_succeeded": jobs,
        **figures,
        "max_live_attempts_per_job": sampler.max_rows_per_job,
        "max_live_workers_per_job": sampler.max_workers_per_job,
        "samples": sampler.samples,
        "gpus": orch.env["ORCH_SIM_GPUS"],
        "gpu_plan": "3,3",
    }
    print("chaos:", json.dumps(report))
    if os.environ.get("ORCH_RECORD_FIGURES"):  # refresh the committed figures on purpose only
        RESULTS_FILE.parent.mkdir(parents=True, exist_ok=True)
        RESULTS_FILE.write_text(json.dumps(report, indent=2) + "\n")


@pytest.mark.slow
def test_tmux_server_killed_mid_sweep(orch: Orch) -> None:
    jobs = 10
    orch.write_suite("chaos", {"chaos": {"sim_mem_gib": 3, "sim_seconds": 3}}, mem_gib=4, max_attempts=8)
    orch.submit("chaos", " ".join(f"{seed}:glue_rte" for seed in range(jobs)), "--gpu-plan", "2,2")
    orch.start_daemon()
    wait_until(lambda: len([a for a in orch.live_attempts() if a.held_mib > 0]) >= 2,
               30, "workers holding memory")
    subprocess.run(["tmux", "-L", orch.socket, "kill-server"], check=True, capture_output=True)
    orch.wait_all_done(120)
    _assert_exactly_once(orch, jobs)
    assert orch.daemon_pid() is not None


def test_hung_worker_killed_retried_once_then_failed(orch: Orch) -> None:
    orch.write_suite("hang", {"hang": {"sim_mem_gib": 2, "sim_seconds": 2, "sim_fail": "hang"}},
                     mem_gib=3, hang_timeout_s=3)
    orch.submit("hang", "1:a")
    orch.start_daemon()
    states = orch.wait_all_done(60)
    assert states == {1: "failed"}
    attempts = orch.json("show", "1")["attempts"]
    assert [(a["outcome"], a["level"]) for a in attempts] == [("failed", 0), ("failed", 0)]
    assert all(a["reason"] == "hung" for a in attempts)
    for row in orch.attempts(1):
        assert row["pgid"] and not group_alive(int(row["pgid"]))


@pytest.mark.slow
def test_concurrent_submits_make_exactly_the_jobs(orch: Orch) -> None:
    orch.write_suite("many", {"many": {"sim_mem_gib": 1, "sim_seconds": 30}}, mem_gib=1)
    orch.run("plan", "set", "1,1")
    orch.start_daemon()
    procs = [
        orch.popen("submit", "--suite", "many", "--pairs", " ".join(f"{p * 50 + i}:glue_rte" for i in range(50)))
        for p in range(8)
    ]
    codes = [proc.wait(timeout=120) for proc in procs]
    errors = [proc.stderr.read() for proc in procs if proc.returncode != 0 and proc.stderr]
    assert codes == [0] * 8, errors
    assert len(orch.job_states()) == 400
    assert len({(job.seed, job.data) for job in orch.jobs()}) == 400
    orch.run("cancel", "--all")


def test_unwritable_runs_dir_fails_the_attempt_daemon_lives(orch: Orch) -> None:
    orch.write_suite("blocked", {"blocked": {"sim_mem_gib": 1}}, mem_gib=1, max_attempts=2)
    orch.submit("blocked", "1:a")
    runs = orch.db.parent / "runs"
    runs.mkdir()
    if os.geteuid() == 0:
        (runs / "blocked").write_text("")  # root ignores mode bits: block the suite's dir itself
    runs.chmod(0o500)
    orch.start_daemon()
    states = orch.wait_all_done(30)
    assert states == {1: "failed"}
    attempts = orch.json("show", "1")["attempts"]
    assert attempts and all(a["outcome"] == "failed" for a in attempts)
    assert all("could not start" in (a["reason"] or "") for a in attempts)
    status = orch.json("daemon", "status")
    assert status["alive"] is True
    assert orch.json("status")["daemon"]["alive"] is True


def test_drain_starts_nothing_new_and_exits_when_idle(orch: Orch) -> None:
    # long enough that neither running job ends (and frees a slot) before the drain is seen
    orch.write_suite("drain", {"drain": {"sim_mem_gib": 2, "sim_seconds": 8}}, mem_gib=3)
    orch.submit("drain", "1:a 2:a 3:a 4:a 5:a", "--gpu-plan", "1,1")
    daemon = orch.start_daemon()
    wait_until(lambda: len(orch.live_attempts()) == 2, 30, "two running")
    started_before = {a.job_id for a in orch.attempt_rows()}
    stopper = orch.popen("daemon", "stop", "--drain")
    wait_until(lambda: orch.json("daemon", "status")["draining"] or not pid_alive(daemon), 10, "draining")
    assert stopper.wait(timeout=60) == 0
    assert not pid_alive(daemon)
    assert {a.job_id for a in orch.attempt_rows()} == started_before
    states = orch.job_states()
    assert sorted(states[j] for j in started_before) == ["succeeded", "succeeded"]
    assert Counter(states.values()) == {"succeeded": 2, "queued": 3}
