"""Multi-GPU jobs and host RAM end to end on simulated GPUs: real daemon, tmux and SQLite; the sim
worker holds its memory on each of its N cards and on a simulated host."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Orch, requires_tmux, wait_until

from orchestrator.gpu.sim_files import read_holders, sim_uuid
from orchestrator.lifecycle import JobState
from orchestrator.store.attempts import read_all_shapes
from orchestrator.store.queries import get_attempts
from orchestrator.store.resources import read_host_shapes
from tests.store_reads import job_ids

pytestmark = [requires_tmux, pytest.mark.tmux]


SIM_GPUS = "4x24GiB"  # the simulated cards of the `orch` fixture (tests/conftest.py)


def _gpus_of(attempt: dict[str, Any]) -> list[str]:
    return json.loads(attempt["gpu_uuids_json"]) if attempt["gpu_uuids_json"] else [attempt["gpu_uuid"]]


class Sampler:
    """Reads the simulated cards while the sweep runs: which pids hold memory on which card."""

    def __init__(self, orch: Orch) -> None:
        self.orch = orch
        self.stop = threading.Event()
        self.cards_by_pid: list[dict[int, set[int]]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        sim = self.orch.root / "sim"
        while not self.stop.is_set():
            seen: dict[int, set[int]] = {}
            for index in range(4):
                holders, _ = read_holders(sim / f"gpu{index}")
                for pid, mib in holders:
                    if mib > 0:
                        seen.setdefault(pid, set()).add(index)
            self.cards_by_pid.append(seen)
            self.stop.wait(0.05)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(5)


@pytest.mark.slow
def test_a_mixed_sweep_of_one_two_and_four_gpu_jobs_never_places_a_partial_gang(orch: Orch) -> None:
    orch.write_suite("mixed", {
        "one": {"sim_mem_gib": 9, "gpus": 1},
        "two": {"sim_mem_gib": 9, "gpus": 2},
        "four": {"sim_mem_gib": 9, "gpus": 4},
    }, mem_gib=10)
    orch.submit("mixed", "1:glue_rte 2:glue_rte", "--gpu-plan", "2")
    orch.start_daemon()
    with Sampler(orch) as sampler:
        states = orch.wait_all_done(150)
    assert set(states.values()) == {"succeeded"}, states
    jobs = {job.id: job for job in orch.jobs()}
    assert sorted(j.gpus for j in jobs.values()) == [1, 1, 2, 2, 4, 4]
    pids_of_gangs: dict[int, int] = {}
    for attempt in orch.attempts():
        job = jobs[attempt["job_id"]]
        uuids = _gpus_of(attempt)
        assert len(uuids) == len(set(uuids)) == job.gpus, (job, uuids)
        env = json.loads((Path(attempt["run_dir"]) / "env.json").read_text())
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
        assert attempt["outcome"] == "succeeded" and attempt["peak_mib"] >= 8 * 1024  # per rank
        if job.gpus > 1:
            held = json.loads(attempt["peak_by_gpu_json"])  # per-rank peaks, one per card
            assert sorted(held) == sorted(uuids) and all(v > 0 for v in held.values()), held
            log = (Path(attempt["run_dir"]) / "stdout.log").read_text()
            worker_pid = int(re.search(r"sim worker: pid (\d+)", log).group(1))  # type: ignore[union-attr]
            pids_of_gangs[worker_pid] = job.gpus
    # Seen from the cards: a gang's process holds memory on all of its cards, or on none yet
    # (it allocates on each card in turn within one step), never on a card outside its set.
    assert sampler.cards_by_pid, "the sampler read nothing"
    seen_gang = False
    for reading in sampler.cards_by_pid:
        for pid, cards in reading.items():
            if pid in pids_of_gangs:
                seen_gang = True
                assert len(cards) <= pids_of_gangs[pid]
    assert seen_gang
    # two jobs on a card at most (the plan), counting every rank of every gang
    for reading in sampler.cards_by_pid:
        per_card: dict[int, int] = {}
        for cards in reading.values():
            for card in cards:
                per_card[card] = per_card.get(card, 0) + 1
        assert max(per_card.values(), default=0) <= 2, reading
    # learned per shape, with N in the shape
    assert len(orch.read(read_all_shapes)) >= 3


@pytest.mark.slow
def test_a_four_gpu_job_is_not_starved_by_a_stream_of_one_gpu_jobs(orch: Orch) -> None:
    # The four cards are first taken by jobs that run long enough for the gang's and the stream's
    # waiting reasons to be read while they run: with 3 s ones, a loaded machine spent their
    # whole run on the `orch submit` calls below, and the gang started before a reason was read.
    orch.write_suite("first", {"long": {"sim_mem_gib": 9, "sim_seconds": 12}}, mem_gib=10)
    orch.write_suite("stream", {"small": {"sim_mem_gib": 9, "sim_seconds": 3}}, mem_gib=10)
    orch.write_suite("big", {"wide": {"sim_mem_gib": 9, "sim_seconds": 1, "gpus": 4}}, mem_gib=10)
    orch.submit("first", " ".join(f"{s}:glue_rte" for s in range(1, 5)), "--gpu-plan", "1")
    orch.start_daemon(poll_s=0.1)
    wait_until(
        lambda: len(orch.read(lambda store: job_ids(store, JobState.RUNNING))) == 4,
        30,
        "four one-GPU jobs running",
    )
    orch.submit("big", "1:glue_rte")
    (gang_id,) = orch.read(lambda store: job_ids(store, suite="big"))
    seed = 100
    reasons: set[str] = set()

    def gang_started() -> bool:
        nonlocal seed
        # the reasons first: the `orch submit` below is the slow part of a round
        reasons.update(job.wait_reason for job in orch.jobs(JobState.QUEUED) if job.wait_reason is not None)
        if orch.read(lambda store: get_attempts(store, gang_id)):
            return True
        # a higher-priority one-GPU job keeps arriving, ahead of the gang in queue order
        seed += 1
        orch.submit("stream", f"{seed}:glue_rte", "--priority", "5")
        return False

    wait_until(gang_started, 60, "the four-GPU job to start", poll_s=0.5)
    assert any("reserved for it" in r for r in reasons), reasons
    assert any(f"reserved for multi-GPU job {gang_id}" in r for r in reasons), reasons
    (attempt,) = orch.attempts(gang_id)
    assert _gpus_of(attempt) == [sim_uuid(i) for i in range(4)]


@pytest.mark.slow
def test_host_memory_limited_jobs_are_held_back_instead_of_killed(orch: Orch) -> None:
    orch.env["ORCH_SIM_HOST"] = "24GiB"  # 22 GiB usable beside the default 2 GiB reserve
    # 9 GiB of host RAM each: two fit, a third would be killed by the (simulated) host
    orch.write_suite("hosty", {"loader": {"sim_mem_gib": 4, "sim_seconds": 2, "sim_host_gib": 9, "host_mem_gib": 9}},
                     mem_gib=5)
    orch.submit("hosty", " ".join(f"{s}:glue_rte" for s in range(1, 6)), "--gpu-plan", "2")
    orch.start_daemon()
    most = 0
    reasons: set[str] = set()

    def done() -> bool:
        nonlocal most
        holders, _ = read_holders(orch.root / "sim" / "host")  # what the simulated host hands out
        most = max(most, len([mib for _, mib in holders if mib > 0]))
        reasons.update(job.wait_reason for job in orch.jobs() if job.wait_reason is not None)
        return orch.all_done()

    wait_until(done, 120, "every job to end")
    outcomes = [a["outcome"] for a in orch.attempts()]
    assert outcomes == ["succeeded"] * 5, outcomes
    assert most == 2  # two at a time on the host, though the GPUs had room for eight
    assert any(r.startswith("host RAM: ") and r.endswith("needs 9.0 GiB") for r in reasons), reasons
    assert max(a["host_peak_mib"] for a in orch.attempts()) == 9 * 1024
    (learned_mib,) = orch.read(read_host_shapes).values()
    assert learned_mib == 9 * 1024
    status = orch.json("status", "--once")
    assert status["host"]["total_mib"] == 24 * 1024
