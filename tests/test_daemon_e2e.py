"""The daemon end to end: CLI, tmux, SQLite and simulated GPUs, all real."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Orch, group_alive, orch_env, pid_alive, requires_tmux, wait_until
from hostile_helpers import hostile_command

from orchestrator.attempts.kills import KILL_GRACE_S
from orchestrator.gpu.sim import hold_foreign
from orchestrator.gpu.sim_files import gpu_dir, read_holders
from orchestrator.store.queries import get_job
from orchestrator.store.rows import Attempt

pytestmark = [requires_tmux, pytest.mark.tmux]

CARD_MIB = 24 * 1024
SIM_PEAK_GIB = {"big": 15, "small": 5}  # the true simulated peaks of the suites below




def _sweep_suites(orch: Orch) -> None:
    # Correct declared memory: a big job (15 GiB, more than half a card) never shares a card
    # with another big one; a small one fits beside it.
    orch.write_suite("big", {"big": {"sim_mem_gib": SIM_PEAK_GIB["big"], "sim_seconds": 2.5}}, mem_gib=15)
    orch.write_suite("small", {"small": {"sim_mem_gib": SIM_PEAK_GIB["small"]}}, mem_gib=6)


class Sampler(threading.Thread):
    """Reads, over and over while the sweep runs, each simulated card's holders (the worker
    processes holding its memory) and the live attempts in the store."""

    def __init__(self, orch: Orch) -> None:
        super().__init__(daemon=True)
        self.orch = orch
        # (card, suite) of each live attempt; card -> how many worker processes hold it
        self.samples: list[tuple[list[tuple[int, str]], dict[int, int]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        suite_of = {job.id: job.suite for job in self.orch.jobs()}  # every job is submitted before it starts
        sim_dir = Path(self.orch.env["ORCH_SIM_DIR"])
        while not self.stop.is_set():
            holding = {card: len(read_holders(gpu_dir(sim_dir, card))[0]) for card in (0, 1)}
            live = [(a.gpu_index, suite_of[a.job_id]) for a in self.orch.live_attempts()]
            self.samples.append((live, holding))
            self.stop.wait(0.05)


@pytest.mark.slow
def test_sweep_packs_within_caps_and_memory(orch: Orch) -> None:
    _sweep_suites(orch)
    orch.submit("big", "1:glue_rte 2:glue_rte 3:glue_rte 4:glue_rte 5:glue_rte 6:glue_rte", "--gpu-plan", "2,1")
    orch.submit("small", "1:glue_rte 2:glue_rte 3:glue_rte 4:glue_rte 5:glue_rte 6:glue_rte 7:glue_rte 8:glue_rte")
    assert len(orch.job_states()) == 14
    sampler = Sampler(orch)
    sampler.start()
    orch.start_daemon()

    # A second daemon for the same state.db is refused, clearly.
    second = orch.run("daemon", "start", check=False)
    assert second.returncode != 0
    assert "already running" in second.stderr

    # While the cards are full, queued jobs say why they wait; status shows what runs.
    def full_with_reasons() -> dict[str, Any] | None:
        status = orch.json("status")
        queued = [j for j in orch.json("jobs") if j["state"] == "queued"]
        if status["counts"]["running"] >= 2 and queued and all(j["wait_reason"] for j in queued):
            return status
        return None

    status = wait_until(full_with_reasons, 30, "full cards with waiting reasons")
    assert status["daemon"]["alive"] is True
    live = {a.job_id: a.gpu_index for a in orch.live_attempts()}
    shown = {r["id"]: r["gpu"] for r in status["running"]}
    assert set(shown) <= set(live) | set(orch.job_states())  # a job may end between the two reads
    assert all(live.get(job_id, gpu) == gpu for job_id, gpu in shown.items())
    assert sum(g["running"] for g in status["gpus"]) == len(status["running"])
    frame = orch.run("status", "--once").stdout
    assert "running" in frame and ("big" in frame or "small" in frame)

    states = orch.wait_all_done(120)
    sampler.stop.set()
    sampler.join()
    assert Counter(states.values()) == {"succeeded": 14}

    caps = {0: 2, 1: 1}
    assert len(sampler.samples) > 20
    for live, holding in sampler.samples:
        assert all(count <= caps[gpu] for gpu, count in holding.items()), (live, holding)
        for gpu, count in Counter(card for card, _ in live).items():
            if count > holding[gpu]:
                # a worker that has ended (its memory free) whose end the daemon has yet to record,
                # or one not yet holding its card: the store lists more than run there
                continue
            peaks_gib = sum(SIM_PEAK_GIB[suite] for card, suite in live if card == gpu)
            assert peaks_gib * 1024 <= CARD_MIB, (live, holding)
    assert any(sum(holding.values()) == 3 for _, holding in sampler.samples)  # the caps were reached, not only kept
    outcomes = Counter(a["outcome"] for a in orch.attempts())
    assert outcomes == {"succeeded": 14}  # nothing OOM'd: the packing never overfilled a card

    first = min(orch.job_states())
    logs = orch.run("logs", str(first)).stdout
    assert "sim worker: done" in logs


@pytest.mark.slow
def test_plan_zero_and_foreign_memory_keep_jobs_off(tmp_path: Path) -> None:
    # GPU 1 is visible but at plan 0; GPU 2 is full of someone else's memory.
    with orch_env(tmp_path, gpus="3x24GiB", foreign="2:20GiB") as orch:
        orch.write_suite("small", {"small": {"sim_mem_gib": 5, "sim_seconds": 1}}, mem_gib=6)
        orch.submit("small", "1:a 2:a 3:a 4:a 5:a", "--gpu-plan", "2,0,2")
        orch.start_daemon()
        gpus = {g["index"]: g for g in orch.json("status")["gpus"]}
        assert gpus[2]["foreign_mib"] == 20 * 1024
        assert gpus[1]["slots"] == 0
        states = orch.wait_all_done(90)
        assert set(states.values()) == {"succeeded"}
        assert {a["gpu_index"] for a in orch.attempts()} == {0}


def test_cancel_kills_the_whole_process_group(orch: Orch) -> None:
    orch.write_suite("long", {"long": {"sim_mem_gib": 2, "sim_seconds": 120}}, mem_gib=3)
    orch.submit("long", "1:a")
    orch.start_daemon()

    def pid_record() -> dict[str, Any] | None:
        rows = orch.attempt_rows(1)
        path = Path(rows[0].run_dir) / "pid.json" if rows else None
        if path is None or not path.exists():
            return None
        record = json.loads(path.read_text())
        return record if record.get("child_pid") else None

    record = wait_until(pid_record, 30, "the worker's pid.json")
    worker_pid, pgid = int(record["child_pid"]), int(record["pgid"])
    wait_until(lambda: any(a.held_mib > 0 for a in orch.attempt_rows(1)), 30, "the worker to hold memory")
    assert pid_alive(worker_pid)

    orch.run("cancel", "1")
    wait_until(lambda: orch.job_states()[1] == "cancelled", 30, "job 1 to be cancelled")
    assert not pid_alive(worker_pid)
    assert not group_alive(pgid)
    (attempt,) = orch.attempts(1)
    assert attempt["outcome"] == "cancelled"
    assert attempt["ended_at"] is not None


def test_a_cancel_of_a_worker_ignoring_sigterm_never_stalls_scheduling(orch: Orch) -> None:
    # The kill is signalled in one pass and confirmed in later ones: while the first job's group
    # outlives its SIGTERM, the daemon goes on scheduling, and a job that became placeable
    # meanwhile starts. Job 2 waits for memory that another user's process holds until the
    # moment job 1 is cancelled.
    foreign = [hold_foreign(orch.root / "sim", index, 20 * 1024) for index in (0, 1)]
    orch.write_suite("stubborn", {"stubborn": {"corrupt": "none", "ignore_term": True, "hold_s": 600}},
                     worker=hostile_command(), mem_gib=0.25)
    orch.write_suite("quick", {"quick": {"sim_mem_gib": 1, "sim_seconds": 1}}, mem_gib=2)
    orch.submit("stubborn", "1:a")
    orch.submit("quick", "1:a")
    orch.start_daemon()
    first = wait_until(lambda: (rows := [a for a in orch.attempt_rows(1) if a.pgid is not None])
                       and "hostile worker: did" in _log(rows[0]) and rows[0], 30, "job 1 running, ignoring SIGTERM")
    pgid = int(str(first.pgid))
    wait_until(lambda: "free" in (orch.read(lambda store: get_job(store, 2).wait_reason) or "").lower(), 30,
               "job 2 to wait for memory")
    cancelled_at = time.monotonic()  # before the CLI: the daemon's grace may start before it returns
    orch.run("cancel", "1")
    for path in foreign:
        path.unlink()
    second = wait_until(lambda: orch.attempt_rows(2), 30, "job 2 to start")
    # the first kill is still pending: its group ignores SIGTERM, and SIGKILL comes after the grace
    still_pending = group_alive(pgid) and any(a.outcome is None for a in orch.attempt_rows(1))
    assert still_pending, "job 2 started only once job 1's kill was over"
    wait_until(lambda: orch.job_states()[1] == "cancelled", 30, "job 1 to be cancelled")
    assert time.monotonic() - cancelled_at >= KILL_GRACE_S - 1  # it waited out the grace, then SIGKILL
    assert not group_alive(pgid)
    (attempt,) = orch.attempts(1)
    assert attempt["outcome"] == "cancelled" and attempt["ended_at"] > second[0].started_at
    assert orch.wait_all_done(30) == {1: "cancelled", 2: "succeeded"}


def _log(attempt: Attempt) -> str:
    path = Path(attempt.run_dir) / "stdout.log"
    return path.read_text() if path.exists() else ""


def test_a_new_database_in_the_same_folder_never_reads_the_old_runs(orch: Orch) -> None:
    # Job ids restart at 1 after `rm state.db`: the new job 1 is given the old job 1's run dir.
    # Its stale result.json and exit.json (a success) must not become the new attempt's outcome.
    orch.write_suite("s", {"c": {"sim_mem_gib": 1, "sim_seconds": 0.5, "sim_ramp_s": 0.1}}, mem_gib=2)
    orch.submit("s", "1:glue_rte")
    orch.start_daemon()
    assert orch.wait_all_done(30) == {1: "succeeded"}
    orch.stop_daemon()
    (old_dir,) = [a["run_dir"] for a in orch.attempts(1)]
    assert (Path(old_dir) / "result.json").is_file()
    for path in orch.root.glob("state.db*"):
        if path.is_file():
            path.unlink()

    orch.write_suite("s", {"c": {"sim_mem_gib": 1, "sim_seconds": 1.0, "sim_ramp_s": 0.1, "sim_fail": "error"}},
                     mem_gib=2, max_attempts=1)  # fmt: skip
    orch.submit("s", "1:glue_rte")
    orch.start_daemon()
    assert orch.wait_all_done(30) == {1: "failed"}
    (attempt,) = orch.attempts(1)
    assert attempt["run_dir"] == old_dir and attempt["outcome"] == "failed", attempt
    assert "sim_fail" in (Path(old_dir) / "config.yaml").read_text()  # the dir is the new attempt's
    kept = Path(old_dir).with_name("attempt-1.stale-1")
    assert (kept / "result.json").is_file() and (kept / "exit.json").is_file()
