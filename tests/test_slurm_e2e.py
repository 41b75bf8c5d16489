"""The demo sweep through a real single-node Slurm (fake GPUs gpu:2,shard:8, no cgroups).

munged, slurmctld and slurmd run from tests/slurm/*.conf in a private directory; the daemon is
`orch daemon start --executor slurm`, the workers are the sim worker on simulated GPUs whose
index Slurm picks (CUDA_VISIBLE_DEVICES of the allocation). Skipped where Slurm is not
installed, except in CI (env CI set), where a missing Slurm fails the module.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import Orch, orch_env, wait_until
from slurm_cluster import SlurmCluster, missing_binaries

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

DEMO_PAIRS = "1:glue_rte 2:glue_rte 3:glue_rte"
REPO_PLANS = Path(__file__).resolve().parent.parent / "plans"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    missing = missing_binaries()
    if missing:
        message = f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurmctld slurmd slurm-client munge"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    if os.geteuid() != 0:
        message = "the test cluster's daemons run as root (SlurmUser=root)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    # a short path: munge's socket path must fit in sun_path
    root = Path(tmp_path_factory.mktemp("slurm"))
    slurm = SlurmCluster(root)
    slurm.start()
    try:
        yield slurm
    finally:
        slurm.stop()


def _orch(tmp_path: Path, cluster: SlurmCluster) -> Iterator[Orch]:
    with orch_env(tmp_path) as orch:
        orch.env.update(cluster.env)
        shutil.copytree(REPO_PLANS / "configs" / "demo", orch.plans / "configs" / "demo")
        # demo_large peaks above a whole 24 GiB card at its first level here, so it OOMs there
        # whatever Slurm packs beside it (at 15 GiB it OOMs only when two share a card, which a
        # running attempt's learned peak may avoid); its second level fits (21 GiB).
        large = orch.plans / "configs" / "demo" / "demo_large.yaml"
        large.write_text(large.read_text().replace("sim_mem_gib: 15", "sim_mem_gib: 30"))
        shutil.copy(REPO_PLANS / "suites" / "demo.yaml", orch.plans / "suites" / "demo.yaml")
        try:
            yield orch
        finally:
            cluster._run("scancel", "--full", "-u", os.environ.get("USER", "root"))


@pytest.fixture
def orch(tmp_path: Path, cluster: SlurmCluster) -> Iterator[Orch]:
    yield from _orch(tmp_path, cluster)


def start_slurm_daemon(orch: Orch, *extra: str) -> int:
    orch.run("daemon", "start", "--executor", "slurm", "--poll", "0.5", *extra)
    pid = int(orch.json("daemon", "status")["pid"])
    orch.daemon_pids.add(pid)
    return pid


def slurm_jobs(cluster: SlurmCluster) -> dict[str, tuple[str, str]]:
    """Every job slurmctld knows (running, pending and recently ended): id -> (name, state)."""
    done = cluster._run("scontrol", "-o", "show", "job")
    jobs: dict[str, tuple[str, str]] = {}
    for line in done.stdout.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if "JobId" in fields:
            jobs[fields["JobId"]] = (fields.get("JobName", ""), fields.get("JobState", ""))
    return jobs


def test_demo_sweep_through_slurm(orch: Orch, cluster: SlurmCluster) -> None:
    orch.submit("demo", DEMO_PAIRS)
    before = set(slurm_jobs(cluster))
    peak_shards = 0
    pending_reasons: set[str] = set()
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak_shards
        while not stop.is_set():
            peak_shards = max(peak_shards, cluster.shards_in_use())
            for row in orch.query("SELECT executor_state FROM attempts WHERE outcome IS NULL"):
                if (row["executor_state"] or "").startswith("PENDING ("):
                    pending_reasons.add(row["executor_state"])
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start_slurm_daemon(orch, "--max-in-queue", "9")
    try:
        states = orch.wait_all_done(300)
    finally:
        stop.set()
        sampler.join(5)
    assert set(states.values()) == {"succeeded"}, states
    assert 0 < peak_shards <= 8, peak_shards
    assert pending_reasons, "no attempt was seen waiting in Slurm's queue with its reason"
    attempts = orch.attempts()
    ids = [a["executor_id"] for a in attempts]
    assert all(a["executor"] == "slurm" and str(a["executor_id"]).isdigit() for a in attempts), attempts
    assert len(set(ids)) == len(ids), "an attempt shared a Slurm job"
    known = slurm_jobs(cluster)
    ours = {k: v for k, v in known.items() if k not in before}
    assert sorted(ours) == sorted(ids), "every sbatch job is one attempt, and nothing else was submitted"
    for attempt in attempts:
        job = orch.query("SELECT suite FROM jobs WHERE id = ?", (attempt["job_id"],))[0]
        assert ours[attempt["executor_id"]][0] == f"orch-{job['suite']}-{attempt['job_id']}-a{attempt['n']}"
        script = (Path(attempt["run_dir"]) / "sbatch.sh").read_text()
        assert "#SBATCH --gres=shard:" in script and "#SBATCH --mem=" in script and "#SBATCH --cpus-per-task=" in script
    # the under-declared config (demo_large: declares 8 GiB, peaks at 30 here) OOMs and succeeds
    # at a later level, as a new Slurm job
    ooms = [a for a in attempts if a["outcome"] == "oom"]
    assert ooms, "no attempt OOM'd"
    for oom in ooms:
        later = [a for a in attempts if a["job_id"] == oom["job_id"] and a["n"] > oom["n"]]
        assert later and later[-1]["outcome"] == "succeeded"
        assert later[0]["executor_id"] != oom["executor_id"]
        assert later[-1]["level"] > oom["level"]
    # learning from the wrapper's own measurement: every success recorded a peak
    assert all(a["peak_mib"] > 0 for a in attempts if a["outcome"] == "succeeded")


def _slow_suite(orch: Orch, seconds: int = 60) -> None:
    orch.write_suite("long", {"long": {"sim_mem_gib": 4, "sim_seconds": seconds, "sim_ramp_s": 0.5}}, mem_gib=4,
                     slurm={"time": "10:00", "cpus": 1, "mem": "512M"})


def _running_in_slurm(orch: Orch, count: int) -> list[dict]:
    rows = orch.query("SELECT * FROM attempts WHERE outcome IS NULL AND executor_state = 'RUNNING'")
    ready = [r for r in rows if (Path(r["run_dir"]) / "pid.json").exists()]
    return ready if len(ready) >= count else []


def test_cancel_scancels(orch: Orch, cluster: SlurmCluster) -> None:
    _slow_suite(orch)
    orch.submit("long", "1:glue_rte")
    start_slurm_daemon(orch)
    (attempt,) = wait_until(lambda: _running_in_slurm(orch, 1), 60, "the attempt running in Slurm")
    status = orch.json("status")
    assert any(r["executor_id"] == attempt["executor_id"] for r in status["running"])
    orch.run("cancel", str(attempt["job_id"]))
    wait_until(lambda: orch.job_states()[attempt["job_id"]] == "cancelled", 60, "the job cancelled")
    # Slurm shows COMPLETING while the job's processes are reaped, then CANCELLED
    def slurm_state() -> str | None:
        _name, state = slurm_jobs(cluster)[attempt["executor_id"]]
        return None if state == "COMPLETING" else state
    assert wait_until(slurm_state, 60, "Slurm to finish cancelling the job") == "CANCELLED"
    assert orch.attempts(attempt["job_id"])[0]["outcome"] == "cancelled"


def test_daemon_killed_and_restarted_resubmits_nothing(orch: Orch, cluster: SlurmCluster) -> None:
    _slow_suite(orch, seconds=12)
    before = set(slurm_jobs(cluster))
    orch.submit("long", "1:a 2:a 3:a 4:a 5:a 6:a")  # 6 x 1 shard... all fit: some run, the limit queues the rest
    pid = start_slurm_daemon(orch, "--max-in-queue", "4")
    wait_until(lambda: _running_in_slurm(orch, 2), 60, "attempts running in Slurm")
    os.kill(pid, signal.SIGKILL)
    live = {r["id"]: r["executor_id"] for r in orch.query("SELECT * FROM attempts WHERE outcome IS NULL")}
    assert live and all(live.values())
    start_slurm_daemon(orch, "--max-in-queue", "4")
    states = orch.wait_all_done(240)
    assert set(states.values()) == {"succeeded"}, states
    attempts = orch.attempts()
    for attempt_id, job_id in live.items():
        row = next(a for a in attempts if a["id"] == attempt_id)
        assert row["executor_id"] == job_id and row["outcome"] == "succeeded", row
    assert len(attempts) == 6, "an attempt was submitted twice"
    names = [name for job_id, (name, _) in slurm_jobs(cluster).items() if job_id not in before]
    assert len(names) == len(set(names)) == 6


def test_slurmd_killed_mid_job_ends_attempts_lost_and_requeued(orch: Orch, cluster: SlurmCluster) -> None:
    _slow_suite(orch, seconds=90)
    orch.submit("long", "1:a 2:a")
    start_slurm_daemon(orch)
    running = wait_until(lambda: _running_in_slurm(orch, 2), 60, "both attempts running in Slurm")
    cluster.kill("slurmd")
    try:
        def lost() -> list[dict]:
            rows = [orch.attempts(r["job_id"])[0] for r in running]
            return rows if all(r["outcome"] == "lost" for r in rows) else []
        rows = wait_until(lost, 120, "the attempts to end lost")
        assert all("NODE_FAIL" in (r["reason"] or "") for r in rows), [r["reason"] for r in rows]
        assert all(orch.job_states()[r["job_id"]] in ("queued", "running") for r in rows)
    finally:
        # leftover batch steps of the dead node: end them as a rebooted node would
        for r in running:
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(int(json.loads((Path(r["run_dir"]) / "pid.json").read_text())["pgid"]), signal.SIGKILL)
        cluster.start_slurmd()
        cluster.wait_idle(60)
    wait_until(lambda: all(orch.attempts(r["job_id"])[-1]["n"] == 2 for r in running), 60, "the jobs resubmitted")
    assert all(orch.attempts(r["job_id"])[-1]["executor_id"] != r["executor_id"] for r in running)


def test_slurm_unreachable_for_a_while_fails_no_job(orch: Orch, cluster: SlurmCluster) -> None:
    _slow_suite(orch, seconds=15)
    orch.submit("long", "1:a 2:a")
    start_slurm_daemon(orch)
    wait_until(lambda: _running_in_slurm(orch, 2), 60, "both attempts running in Slurm")
    log = Path(str(orch.db) + ".daemon.log")
    cluster.kill("slurmctld", signal.SIGTERM)  # a controller restart: it saves its state first
    try:
        wait_until(lambda: log.exists() and "Slurm poll failed" in log.read_text(errors="replace"), 60,
                   "the daemon to see a failed poll")
        assert orch.query("SELECT count(*) AS n FROM attempts WHERE outcome IS NULL")[0]["n"] == 2
    finally:
        cluster.start_slurmctld()
    states = orch.wait_all_done(180)
    assert set(states.values()) == {"succeeded"}, states
    assert [a["outcome"] for a in orch.attempts()] == ["succeeded", "succeeded"]
