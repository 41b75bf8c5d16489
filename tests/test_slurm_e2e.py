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

from orchestrator.store.queries import get_job
from orchestrator.store.rows import Attempt

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

DEMO_PAIRS = "1:glue_rte 2:glue_rte 3:glue_rte"
REPO_PLANS = Path(__file__).resolve().parent.parent / "plans"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    missing = missing_binaries()
    if missing:
        message = (
            f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurmctld "
            "slurmd slurm-client munge"
        )
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
    """Slurm asked every 3 s and a short shared-filesystem grace, unless `extra` says otherwise."""
    timing = [] if "--slurm-poll" in extra else ["--slurm-poll", "3"]
    timing += [] if "--exit-grace" in extra else ["--exit-grace", "3"]
    orch.run("daemon", "start", "--executor", "slurm", "--poll", "0.5", *timing, *extra)
    pid = int(orch.json("daemon", "status")["pid"])
    orch.remember_daemon(pid)
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
            for attempt in orch.live_attempts():
                if (attempt.executor_state or "").startswith("PENDING ("):
                    pending_reasons.add(attempt.executor_state)
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
    suite_of = {job.id: job.suite for job in orch.jobs()}
    for attempt in attempts:
        assert (
            ours[attempt["executor_id"]][0]
            == f"orch-{suite_of[attempt['job_id']]}-{attempt['job_id']}-a{attempt['n']}"
        )
        script = (Path(attempt["run_dir"]) / "sbatch.sh").read_text()
        assert "#SBATCH --gres=shard:" in script and "#SBATCH --cpus-per-task=" in script
        assert "#SBATCH --mem=" not in script  # the demo suite sets no mem: the cluster's default holds
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


def _running_in_slurm(orch: Orch, count: int) -> list[Attempt]:
    rows = [a for a in orch.live_attempts() if a.executor_state == "RUNNING"]
    ready = [a for a in rows if (Path(a.run_dir) / "pid.json").exists()]
    return ready if len(ready) >= count else []


def test_cancel_scancels(orch: Orch, cluster: SlurmCluster) -> None:
    _slow_suite(orch)
    orch.submit("long", "1:glue_rte")
    start_slurm_daemon(orch)
    (attempt,) = wait_until(lambda: _running_in_slurm(orch, 1), 60, "the attempt running in Slurm")
    status = orch.json("status")
    assert any(r["executor_id"] == attempt.executor_id for r in status["running"])
    orch.run("cancel", str(attempt.job_id))
    wait_until(lambda: orch.job_states()[attempt.job_id] == "cancelled", 60, "the job cancelled")
    # Slurm shows COMPLETING while the job's processes are reaped, then CANCELLED
    def slurm_state() -> str | None:
        _name, state = slurm_jobs(cluster)[str(attempt.executor_id)]
        return None if state == "COMPLETING" else state
    assert wait_until(slurm_state, 60, "Slurm to finish cancelling the job") == "CANCELLED"
    assert orch.attempts(attempt.job_id)[0]["outcome"] == "cancelled"


def test_daemon_killed_and_restarted_resubmits_nothing(orch: Orch, cluster: SlurmCluster) -> None:
    _slow_suite(orch, seconds=12)
    before = set(slurm_jobs(cluster))
    orch.submit("long", "1:a 2:a 3:a 4:a 5:a 6:a")  # 6 x 1 shard... all fit: some run, the limit queues the rest
    pid = start_slurm_daemon(orch, "--max-in-queue", "4")
    wait_until(lambda: _running_in_slurm(orch, 2), 60, "attempts running in Slurm")
    os.kill(pid, signal.SIGKILL)
    live = {a.id: a.executor_id for a in orch.live_attempts()}
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
        def lost() -> list[Attempt]:
            rows = [orch.attempt_rows(r.job_id)[0] for r in running]
            return rows if all(r.outcome == "lost" for r in rows) else []
        rows = wait_until(lost, 120, "the attempts to end lost")
        assert all("NODE_FAIL" in (r.reason or "") for r in rows), [r.reason for r in rows]
        assert all(orch.job_states()[r.job_id] in ("queued", "running") for r in rows)
    finally:
        # leftover batch steps of the dead node: end them as a rebooted node would
        for r in running:
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(int(json.loads((Path(r.run_dir) / "pid.json").read_text())["pgid"]), signal.SIGKILL)
        cluster.start_slurmd()
        cluster.wait_idle(60)
    wait_until(lambda: all(orch.attempt_rows(r.job_id)[-1].n == 2 for r in running), 60, "the jobs resubmitted")
    assert all(orch.attempt_rows(r.job_id)[-1].executor_id != r.executor_id for r in running)


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
        assert len(orch.live_attempts()) == 2
    finally:
        cluster.start_slurmctld()
    states = orch.wait_all_done(180)
    assert set(states.values()) == {"succeeded"}, states
    assert [a["outcome"] for a in orch.attempts()] == ["succeeded", "succeeded"]


# -- Slurm's end states ------------------------------------------------------------------------

# A command worker that takes Slurm's time-limit warning (SIGUSR2) and keeps going, printing
# a line a second so it is never silent, until Slurm ends it.
# resumable through `{resume}` (dropped while there is no checkpoint)
WARNED_WORKER = """sh -c 'trap "echo warned" USR2; while true; do echo tick; sleep 1; done' worker {resume}"""


def test_a_time_limit_fails_the_job_naming_it_or_resumes_a_worker_that_can(orch: Orch, cluster: SlurmCluster) -> None:
    orch.write_suite("limited", {"c": {"sim_mem_gib": 1, "sim_seconds": 600}}, mem_gib=1, max_attempts=3,
                     hang_timeout_s=900, slurm={"time": "1", "mem": "256M"})
    orch.write_suite("resumable", {"r": {"resume_from_checkpoint": True}}, worker=WARNED_WORKER, mem_gib=1,
                     max_attempts=1, hang_timeout_s=900, slurm={"time": "1", "mem": "256M", "max_timeouts": 1})
    orch.submit("limited", "1:a")
    orch.submit("resumable", "1:a")
    start_slurm_daemon(orch)
    limited, resumable = sorted(orch.job_states())
    # Slurm checks time limits every 30 s: a 1-minute limit ends the job 60-90 s after it starts
    wait_until(lambda: orch.job_states()[limited] == "failed", 240, "the time-limited job to fail")
    (only,) = orch.attempts(limited)
    assert only["executor_state"] == "TIMEOUT" and only["outcome"] == "failed", only
    reason = orch.read(lambda store: get_job(store, limited).reason)
    assert "reached its time limit (--time=1)" in str(reason), reason
    # the resumable worker: warned first (USR2 forwarded by the wrapper), then resumed at attempt 2,
    # its time limit not counted against max_attempts 1
    first = wait_until(
        lambda: [a for a in orch.attempts(resumable) if a["outcome"]],
        120,
        "its first attempt to end",
    )[0]
    assert first["executor_state"] == "TIMEOUT" and "resumes from its checkpoint" in first["reason"], first
    assert "warned" in (Path(first["run_dir"]) / "stdout.log").read_text()
    exit_record = json.loads((Path(first["run_dir"]) / "exit.json").read_text())
    assert exit_record["received"][:1] == ["SIGUSR2"], exit_record
    assert "#SBATCH --signal=B:USR2@30" in (Path(first["run_dir"]) / "sbatch.sh").read_text()
    wait_until(lambda: len(orch.attempts(resumable)) == 2, 60, "the resumed attempt to be submitted")
    assert orch.read(lambda store: get_job(store, resumable).max_attempts) == 2  # not counted
    # Its cap (max_timeouts 1: the second time limit fails it) is decided by the same code on
    # Slurm's word (test_slurm_outcomes.py); waiting out a second real limit here would add
    # 60-90 s. The running second attempt is cancelled so that no job of it outlives the test.
    orch.run("cancel", str(resumable))
    wait_until(lambda: orch.job_states()[resumable] == "cancelled", 60, "the resumed job cancelled")


def test_a_preempted_attempt_is_requeued_without_counting(
    orch: Orch, cluster: SlurmCluster, tmp_path: Path
) -> None:
    # The worker runs until the test has seen its first attempt end (or 120 s, then fails): the
    # first is preempted whatever the machine's load, and the second ends as soon as it may.
    release = tmp_path / "release"
    worker = (f"""sh -c 'i=0; while [ ! -e {release} ]; do i=$((i+1)); [ $i -gt 1200 ] && exit 3; """
              f"""sleep 0.1; done'""")
    orch.write_suite("low", {"c": {}}, worker=worker, mem_gib=1, max_attempts=1, slurm={"mem": "256M"})
    orch.submit("low", "1:a")
    start_slurm_daemon(orch)
    (running,) = wait_until(lambda: _running_in_slurm(orch, 1), 60, "the attempt running in Slurm")
    # a job of the higher-priority partition that needs every CPU of the node: ours is preempted
    done = cluster._run(
        "sbatch",
        "--parsable",
        "-p",
        "high",
        "-c",
        "8",
        "--mem=100",
        "--output=/dev/null",
        "--wrap",
        "sleep 5",
    )
    assert done.returncode == 0, done.stderr
    wait_until(lambda: orch.attempts(running.job_id)[0]["outcome"], 120, "the preempted attempt to end")
    release.touch()
    states = orch.wait_all_done(180)
    assert list(states.values()) == ["succeeded"], states
    first, second = orch.attempts(running.job_id)
    assert first["executor_state"] == "PREEMPTED" and first["outcome"] == "lost", first
    assert "preempted" in first["reason"] and second["outcome"] == "succeeded"
    (job,) = orch.jobs()
    assert job.max_attempts == 2  # the preemption was not counted


def test_gpus_2_gets_two_gpus_of_one_node_and_nproc_2(orch: Orch, cluster: SlurmCluster, tmp_path: Path) -> None:
    # The worker runs until the test has looked at `orch status` (or 120 s, then fails): a fixed
    # run time could end before a loaded machine gets to look.
    release = tmp_path / "release"
    worker = (f"""sh -c 'echo "cvd=$CUDA_VISIBLE_DEVICES nproc={{nproc}}"; i=0; """
              f"""while [ ! -e {release} ]; do i=$((i+1)); [ $i -gt 1200 ] && exit 3; sleep 0.1; done'""")
    orch.write_suite("pair", {"c": {}}, worker=worker, mem_gib=1, gpus=2, slurm={"mem": "256M"})
    orch.submit("pair", "1:a")
    start_slurm_daemon(orch)
    (running,) = wait_until(lambda: _running_in_slurm(orch, 1), 60, "the attempt running in Slurm")
    shown = orch.run("status").stdout  # a two-GPU attempt the cluster placed is shown by its Slurm job
    release.touch()
    assert f"slurm {running.executor_id} RUNNING" in shown, shown
    assert list(orch.wait_all_done(120).values()) == ["succeeded"]
    (attempt,) = orch.attempts()
    assert "#SBATCH --gres=gpu:2\n" in (Path(attempt["run_dir"]) / "sbatch.sh").read_text()
    assert "cvd=0,1 nproc=2" in (Path(attempt["run_dir"]) / "stdout.log").read_text()


def test_an_exit_record_that_shows_late_on_a_shared_filesystem_is_not_rerun(orch: Orch, cluster: SlurmCluster) -> None:
    # The worker ends its own wrapper before it can write exit.json, as if the node's files had
    # not reached this host yet; the test writes them 10 s after Slurm says the job ended (the
    # daemon asks every 3 s), well within the grace of 40 s.
    orch.write_suite("late", {"c": {}}, worker="sh -c 'sleep 2; kill -9 $PPID'", mem_gib=1, max_attempts=3,
                     slurm={"mem": "256M"})
    orch.submit("late", "1:a")
    start_slurm_daemon(orch, "--exit-grace", "40")
    attempt = wait_until(lambda: [a for a in orch.attempts() if a["executor_id"]], 60, "the attempt submitted")[0]

    def slurm_ended() -> str | None:
        state = slurm_jobs(cluster).get(attempt["executor_id"], ("", ""))[1]
        return state if state not in ("", "PENDING", "RUNNING", "COMPLETING") else None

    wait_until(slurm_ended, 60, "Slurm to end the job")
    ended = threading.Event()
    assert not ended.wait(10)  # the shared filesystem's delay
    assert orch.attempts()[0]["outcome"] is None, "concluded before its exit record could arrive"
    run_dir = Path(attempt["run_dir"])
    token = orch.attempts()[0]["token"]  # as the wrapper writes it: an exit record without it is not this attempt's
    (run_dir / "exit.json.tmp").write_text(
        json.dumps({"exit_code": 0, "signal": None, "ended_at": 0.0, "token": token})
    )
    os.replace(run_dir / "exit.json.tmp", run_dir / "exit.json")
    states = orch.wait_all_done(60)
    assert list(states.values()) == ["succeeded"], states
    assert len(orch.attempts()) == 1, "the finished attempt was run again"


def test_slurm_is_asked_only_on_its_period_at_steady_state(
    orch: Orch, cluster: SlurmCluster, tmp_path: Path
) -> None:
    """At most 4 asks in two periods: at the default period (30 s, test_slurm_poll.py) that is 4
    times a minute. A 10 s period here: its 20 s counted stand for a minute of the default."""
    shims = tmp_path / "shims"
    shims.mkdir()
    calls = tmp_path / "squeue.calls"
    real = shutil.which("squeue")
    assert real is not None
    (shims / "squeue").write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\nexec {real} \"$@\"\n")
    (shims / "squeue").chmod(0o755)
    orch.env["PATH"] = f"{shims}{os.pathsep}{orch.env['PATH']}"
    _slow_suite(orch, seconds=150)
    orch.submit("long", "1:a 2:a 3:a")
    start_slurm_daemon(orch, "--slurm-poll", "10")
    wait_until(lambda: _running_in_slurm(orch, 3), 90, "three attempts running in Slurm")
    settled = threading.Event()
    assert not settled.wait(15)  # past the quick follow-ups of the submissions (2, 6 and 14 s after)
    before = len(calls.read_text().splitlines())
    assert not settled.wait(20)  # two periods at steady state, counted
    asked = calls.read_text().splitlines()[before:]
    print(f"squeue calls in two 10 s periods at steady state: {len(asked)}")
    assert len(asked) <= 4, asked
    assert all("--jobs=" in line for line in asked), asked  # only our jobs, never the whole cluster


def test_a_job_slurm_never_starts_is_shown_as_such_and_holds_no_slot(orch: Orch, cluster: SlurmCluster) -> None:
    orch.write_suite(
        "toolong",
        {"c": {"sim_mem_gib": 1}},
        mem_gib=1,
        slurm={"partition": "short", "time": "5", "mem": "256M"},
    )
    orch.write_suite("fine", {"c": {"sim_mem_gib": 1, "sim_seconds": 1}}, mem_gib=1, slurm={"mem": "256M"})
    orch.submit("toolong", "1:a")
    orch.submit("fine", "1:a")
    start_slurm_daemon(orch, "--max-in-queue", "1")
    stuck, fine = sorted(orch.job_states())
    (attempt,) = wait_until(
        lambda: [a for a in orch.attempts(stuck) if "never starts" in (a["executor_state"] or "")],
        60,
        "the attempt shown as never starting",
    )
    # Slurm names it PartitionConfig on its first look at the job, PartitionTimeLimit later
    assert attempt["executor_state"] in ("PENDING (PartitionTimeLimit: never starts as submitted)",
                                         "PENDING (PartitionConfig: never starts as submitted)"), attempt
    assert "#SBATCH --partition=short" in (Path(attempt["run_dir"]) / "sbatch.sh").read_text()
    # its slot is free: the other suite's job is submitted beside it and runs
    wait_until(lambda: orch.job_states()[fine] == "succeeded", 60, "the other job to run and succeed")
    orch.run("cancel", str(stuck))
    wait_until(lambda: orch.job_states()[stuck] == "cancelled", 60, "the stuck job cancelled")
