"""Untrusted files, other users and full disks, on the real daemon, tmux and SQLite: one test
per guarantee of the reliability table in docs/reliability.md (cross-user cases create a second Unix user
when run as root and are skipped otherwise)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import Orch, group_alive, orch_env, requires_tmux, wait_until
from hostile_helpers import (
    as_user,
    fill_filesystem,
    hostile_command,
    second_user,
    small_tmpfs,
    start_victim,
    stop_victim,
)

from orchestrator.lifecycle import JobState
from orchestrator.store.rows import Attempt

pytestmark = [requires_tmux, pytest.mark.tmux]


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path / "home") as env:
        yield env


@pytest.fixture
def orch_root(tmp_path: Path) -> Path:
    root = tmp_path / "home"
    root.mkdir()
    return root


@contextlib.contextmanager
def _removed(path: Path) -> Iterator[None]:
    try:
        yield
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _running_attempt(orch: Orch, job_id: int) -> Attempt:
    def ready() -> Attempt | None:
        rows = [a for a in orch.attempt_rows(job_id) if a.outcome is None and a.pgid is not None]
        return rows[0] if rows and (Path(rows[0].run_dir) / "pid.json").exists() else None
    return wait_until(ready, 30, f"job {job_id} running")


# -- 1. other users and symlinks ---------------------------------------------------------------

def test_runs_dir_made_by_another_user_in_a_shared_dir_is_refused() -> None:
    shared = Path(tempfile.mkdtemp(prefix="orch-shared-", dir="/tmp"))  # reachable by other users
    shared.chmod(0o1777)  # a shared scratch dir
    with second_user() as other, orch_env(shared) as orch, _removed(shared):
        orch.db = shared / "state.db"
        subprocess.run(  # type: ignore[call-overload]
            ["mkdir", "-p", str(shared / "runs" / "s")], check=True, **as_user(other)
        )
        orch.write_suite("s", {"c": {"sim_mem_gib": 1}}, mem_gib=1)
        orch.submit("s", "1:a")
        proc = orch.run("daemon", "start", check=False)
        assert proc.returncode != 0
        assert f"belongs to uid {other.pw_uid}" in proc.stderr and "Traceback" not in proc.stderr
        assert orch.attempt_rows() == []


def test_world_writable_runs_dir_is_refused(orch: Orch) -> None:
    orch.write_suite("s", {"c": {"sim_mem_gib": 1}}, mem_gib=1)
    orch.submit("s", "1:a")
    runs = orch.root / "runs"
    runs.mkdir()
    runs.chmod(0o777)
    proc = orch.run("daemon", "start", check=False)
    assert proc.returncode == 1 and "other users can write" in proc.stderr
    runs.chmod(0o700)


def test_a_pre_made_symlinked_attempt_dir_is_never_followed(orch: Orch, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    target.chmod(0o755)  # explicitly: the test process's umask may be anything
    (target / "config.yaml").write_text("mine: true\n")
    orch.write_suite("s", {"c": {"sim_mem_gib": 1, "sim_seconds": 1}}, mem_gib=1, max_attempts=2)
    orch.submit("s", "1:a")
    job_dir = orch.root / "runs" / "s" / "000001-c-s1-a"
    job_dir.mkdir(parents=True)
    for level in (orch.root / "runs", job_dir.parent, job_dir):
        level.chmod(0o700)
    (job_dir / "attempt-1").symlink_to(target)
    orch.start_daemon()
    assert orch.wait_all_done(60) == {1: "succeeded"}  # attempt 1 refused, attempt 2 ran
    first = orch.attempts(1)[0]
    assert first["outcome"] == "failed" and "symlink" in first["reason"]
    assert (target / "config.yaml").read_text() == "mine: true\n"
    assert oct(target.stat().st_mode & 0o777) == "0o755"


@pytest.mark.parametrize("victim_of_other_user", [False, True])
def test_a_forged_pid_json_never_gets_another_process_signalled(orch: Orch, victim_of_other_user: bool) -> None:
    with contextlib_user(victim_of_other_user) as other:
        victim = start_victim(other)
        try:
            orch.write_suite("s", {"forge": {"corrupt": "pid_forged", "hold_s": 300, "victim_pid": victim.pid,
                                             "victim_create_time": victim.create_time()}},
                             worker=hostile_command(), mem_gib=0.25, max_attempts=1)
            orch.submit("s", "1:a")
            orch.start_daemon()
            states = orch.wait_all_done(60)  # pid.json disagrees with the launcher: lost, its real group killed
            assert states == {1: "failed"}
            attempt = orch.attempts(1)[0]
            assert attempt["outcome"] == "lost"
            assert victim.is_running() and group_alive(victim.pid)
            assert not group_alive(int(attempt["pid"]))
        finally:
            stop_victim(victim)


class contextlib_user:
    """second_user() when asked for, else nothing (the victim is then our own process)."""

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted
        self._cm = second_user() if wanted else None

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self._cm.__enter__() if self._cm else None

    def __exit__(self, *exc: object) -> None:
        if self._cm:
            self._cm.__exit__(*exc)


# -- 2. one daemon per database, whatever the path ---------------------------------------------

def test_daemon_lock_holds_through_a_symlink_and_a_hard_link(orch: Orch) -> None:
    orch.write_suite("s", {"c": {"sim_mem_gib": 1}}, mem_gib=1)
    orch.submit("s", "1:a")
    pid = orch.start_daemon()
    link = orch.root / "link.db"
    link.symlink_to(orch.db)
    hard = orch.root / "hard.db"
    os.link(orch.db, hard)
    for other in (link, hard):
        proc = orch.run("daemon", "start", "--db", str(other), check=False)
        assert proc.returncode == 1 and "already running" in proc.stderr, proc.stderr
    assert orch.json("daemon", "status", "--db", str(link))["pid"] == pid
    orch.run("daemon", "stop", "--db", str(link))
    assert orch.daemon_pid() is None


def test_the_loser_of_a_daemon_start_race_says_so(orch: Orch) -> None:
    orch.write_suite("s", {"c": {"sim_mem_gib": 1}}, mem_gib=1)
    orch.submit("s", "1:a")
    procs = [orch.popen("daemon", "start") for _ in range(3)]
    outs = [p.communicate(timeout=60) for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 1, 1], outs
    pid = orch.daemon_pid()
    orch.remember_daemon(int(pid or 0))
    for (_, err), code in zip(outs, codes, strict=True):
        if code:
            assert "already running" in err or "at the same time" in err, err
            assert "daemon started (pid" not in err


# -- 3. one malformed value never stops the sweep ----------------------------------------------

MALFORMED = ("pid_str", "create_time_str", "pid_dir", "result_1e308", "progress_step_str")


def test_one_malformed_run_dir_never_stops_the_others(orch: Orch) -> None:
    # every malformed kind at once, beside good jobs, under one daemon
    orch.write_suite("bad", {mode: {"corrupt": mode, "hold_s": 1} for mode in MALFORMED}, worker=hostile_command(),
                     mem_gib=0.25, max_attempts=1)
    orch.write_suite("good", {"good": {"sim_mem_gib": 1, "sim_seconds": 1}}, mem_gib=1)
    orch.run("plan", "set", "4,4")
    orch.submit("bad", "1:a")
    orch.submit("good", "1:a 2:a 3:a")
    orch.start_daemon()
    states = orch.wait_all_done(90)
    bad = {job.id: job.config_name for job in orch.jobs(suite="bad")}
    assert sorted(bad.values()) == sorted(MALFORMED)
    assert [s for j, s in states.items() if j not in bad] == ["succeeded"] * 3
    for job_id, mode in bad.items():
        assert states[job_id] in ("succeeded", "failed"), mode
        reason = orch.attempts(job_id)[0]["reason"]
        assert "ignored invalid run-dir files" in reason, (mode, reason)
    # results say why a succeeded run has no metrics: the file ignored, not "reported none"
    from orchestrator.api import Sweep

    whys = {r["job"]: r["why"] for r in Sweep(orch.db).results(as_frame=False) if r["job"] in bad}
    ignored = [job_id for job_id, mode in bad.items() if mode == "result_1e308"]
    assert states[ignored[0]] == "succeeded" and "ignored invalid run-dir files: result.json" in whys[ignored[0]], whys
    log = Path(str(orch.db) + ".daemon.log").read_text()
    assert "tick failed" not in log


# -- 4. a full disk --------------------------------------------------------------------------

def test_disk_full_jobs_wait_and_resume(orch: Orch) -> None:
    """The runs dir is a real 16 MiB tmpfs mounted for the test (no injected fault); skipped
    where mounting is not allowed."""
    with small_tmpfs(orch.root / "runs", 16, before_unmount=orch.cleanup) as runs:
        orch.write_suite("s", {"c": {"sim_mem_gib": 1, "sim_seconds": 4, "sim_ramp_s": 0.2}}, mem_gib=1, max_attempts=1)
        orch.run("plan", "set", "1,1")
        orch.submit("s", "1:a 2:a 3:a 4:a")
        orch.run("daemon", "start", "--poll", "0.2", "--min-free-mib", "2", "--warn-free-mib", "8")
        orch.remember_daemon(int(orch.daemon_pid() or 0))
        wait_until(lambda: len(orch.live_attempts()) >= 2, 30, "jobs running")
        filler = runs / "filler"
        fill_filesystem(filler)
        def disk_full_status() -> dict[str, object] | None:
            snapshot = orch.json("status")
            return snapshot if (snapshot.get("disk") or {}).get("level") == "full" else None

        status = wait_until(disk_full_status, 30, "status to say the disk is full")
        assert "disk full" in orch.run("status", "--once").stdout
        wait_until(lambda: any((j.wait_reason or "").startswith("disk full") for j in orch.jobs(JobState.QUEUED)),
                   60, "a job waiting for the disk")
        assert status["counts"]["failed"] == 0
        filler.unlink()
        states = orch.wait_all_done(120)
        assert set(states.values()) == {"succeeded"}, states  # max_attempts 1: no disk-full attempt counted
        # the running ones rode it out (their workers wait for room to write their result)
        assert [a["outcome"] for a in orch.attempts()] == ["succeeded"] * 4
        assert orch.json("status")["disk"]["level"] == "ok"


# -- 5. YAML limits ----------------------------------------------------------------------------

def test_yaml_alias_bomb_in_a_config_is_refused_at_once(orch: Orch) -> None:
    orch.write_suite("s", {"c": {"sim_mem_gib": 1}}, mem_gib=1)
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for index in range(1, 12):
        lines.append(f"{chr(97 + index)}: &{chr(97 + index)} [" + ", ".join([f"*{chr(96 + index)}"] * 9) + "]")
    (orch.plans / "configs" / "s" / "c.yaml").write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    proc = orch.run("submit", "--suite", "s", "--pairs", "1:a", check=False, timeout_s=30)
    assert time.monotonic() - started < 20
    assert proc.returncode == 2 and "aliases" in proc.stderr and "Traceback" not in proc.stderr
    assert orch.jobs() == []  # none when there is no database either


# -- 6. a hung worker that ignores SIGTERM: tests/test_clock_rules.py (the clock passes the hang
#    timeout and the kill grace)


# -- 7. smaller ones ---------------------------------------------------------------------------

def test_an_emptied_state_db_is_refused_a_new_one_is_not(orch: Orch) -> None:
    orch.db.parent.mkdir(parents=True, exist_ok=True)
    orch.db.write_bytes(b"")
    assert orch.run("jobs", check=False).returncode == 0  # just created: new
    orch.db.unlink()
    orch.db.write_bytes(b"")
    old = time.time() - 3600
    os.utime(orch.db, (old, old))
    proc = orch.run("jobs", check=False)
    assert proc.returncode == 1 and "empty (0 bytes) but not new" in proc.stderr and "Traceback" not in proc.stderr
    assert orch.db.stat().st_size == 0
    orch.db.unlink()


def test_results_with_non_dict_metrics(orch: Orch) -> None:
    orch.write_suite(
        "r",
        {"r": {"corrupt": "result_metrics_list", "hold_s": 0}},
        worker=hostile_command(),
        mem_gib=0.25,
    )
    orch.submit("r", "1:a")
    orch.start_daemon()
    assert orch.wait_all_done(60) == {1: "succeeded"}
    proc = orch.run("results", check=False)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert "no test metrics" in proc.stderr
    (row,) = orch.json("results")  # the row is there, empty, and says why
    assert (row["mean"], row["n"], row["runs"]) == (None, 0, [])
    assert row["notes"] == ["seed 1 (job 1) reported no test metrics (result.json or printed); ignored invalid "
                            "run-dir files: result.json: metrics must be a mapping, not [1, 2, 3]: not counted"]


def test_cancel_with_an_invalid_pid_json_stops_the_job(orch: Orch) -> None:
    orch.write_suite("c", {"c": {"corrupt": "pid_garbage", "hold_s": 300}}, worker=hostile_command(), mem_gib=0.25)
    orch.submit("c", "1:a")
    orch.start_daemon()
    attempt = _running_attempt(orch, 1)
    run_dir = Path(attempt.run_dir)
    wait_until(lambda: (run_dir / "pid.json").read_bytes().startswith(b"{not"), 30, "pid.json corrupted")
    orch.run("cancel", "1")
    assert orch.wait_all_done(30) == {1: "cancelled"}
    assert not group_alive(int(str(attempt.pid)))
    assert json.loads(json.dumps(orch.json("show", "1")["attempts"][0]["outcome"])) == "cancelled"


def test_logs_of_a_run_dir_whose_log_is_a_fifo_or_link(orch: Orch) -> None:
    orch.write_suite("l", {"fifo": {"corrupt": "log_fifo", "hold_s": 0},
                           "link": {"corrupt": "log_symlink", "hold_s": 0}}, worker=hostile_command(), mem_gib=0.25)
    orch.submit("l", "1:a")
    orch.start_daemon()
    orch.wait_all_done(60)
    for job, kind in (("1", "a FIFO"), ("2", "a symlink")):
        proc = orch.run("logs", job, check=False, timeout_s=20)  # a FIFO must not block it
        assert proc.returncode == 2 and kind in proc.stderr and "root:" not in proc.stdout, proc
