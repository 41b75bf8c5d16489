"""What a hostile worker of the same Unix user cannot do to orch or to other attempts, on the
real daemon, tmux, SQLite and simulated GPUs (docs/reliability.md names each)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from clock_daemon import clock_daemon
from e2e_helpers import Orch, orch_env, pid_alive, requires_tmux, wait_until
from hostile_helpers import fill_filesystem, hostile_command, small_tmpfs

from orchestrator.attempts.containment import cgroup_parent
from orchestrator.daemon.state import tmux_socket_name
from orchestrator.store.sweep_attempts import attempt_counts

ESCAPING_WORKER = Path(__file__).resolve().parent / "data" / "escaping_worker.py"
ESCAPING = f"{sys.executable} {ESCAPING_WORKER} {{config}} {{run_dir}}"
# the ways an attempt's processes are tracked here: its cgroup where one can be made, else the mark
TRACKINGS = ["environment", *(["cgroup"] if cgroup_parent() is not None else [])]

pytestmark = [requires_tmux, pytest.mark.tmux]


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path / "home") as env:
        yield env


def test_a_run_dir_swapped_for_a_link_gets_nothing_written_outside(orch: Orch, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    orch.write_suite("s", {"swap": {"corrupt": "rundir_to_outside", "outside_dir": str(outside), "hold_s": 1.5}},
                     worker=hostile_command(), mem_gib=0.25, max_attempts=1)
    orch.submit("s", "1:a")
    orch.start_daemon()
    assert orch.wait_all_done(60) == {1: "failed"}
    assert sorted(p.name for p in outside.iterdir()) == []  # no exit.json, gpu_peak.json, log
    moved = next((orch.root / "runs" / "s").glob("*/attempt-1.moved"))
    assert (moved / "pid.json").is_file() and not (moved / "exit.json").exists()
    attempt = orch.attempts(1)[0]
    assert "symlink" in attempt["reason"], attempt


def _escaped_pid(orch: Orch, n: int = 1) -> int:
    def written() -> int | None:
        found = list((orch.root / "runs").glob(f"*/*/attempt-{n}/escaped.pid"))
        return int(found[0].read_text()) if found and found[0].read_text() else None
    return wait_until(written, 30, f"attempt {n}'s escaped process")


@pytest.mark.parametrize("tracking", TRACKINGS)
def test_a_hung_worker_that_left_its_session_dies_before_the_next_attempt(orch: Orch, tracking: str) -> None:
    if tracking == "environment":
        orch.env["ORCH_TRACKING"] = "environment"
    # 4 s of silence is a hang: attempt 1 hangs for good, and attempt 2 (a Python start, a line,
    # an exit) must not be judged hung on a loaded 2-core box before it ends
    orch.write_suite("s", {"escape": {"escape": "setsid_hang"}}, worker=ESCAPING, mem_gib=0.25,
                     max_attempts=2, hang_timeout_s=4)
    orch.submit("s", "1:a")
    orch.start_daemon(poll_s=0.1)
    escaped = _escaped_pid(orch)
    assert orch.wait_all_done(60) == {1: "succeeded"}
    assert not pid_alive(escaped)
    first, second = orch.attempts(1)
    assert first["reason"] == "hung"
    # attempt 2 looked for attempt 1's process when it started: already gone
    assert (Path(str(second["run_dir"])) / "predecessor.txt").read_text() == "alive: False\n"
    assert f"pid {escaped} " in first["hunted"] and f"found by its {tracking}" in first["hunted"], first["hunted"]
    shown = orch.run("show", "1").stdout
    assert "left running and ended by orch" in shown and tracking in shown


def test_a_cancelled_worker_that_left_its_session_and_ignores_sigterm_dies(orch: Orch) -> None:
    orch.write_suite("s", {"escape": {"escape": "setsid_hang"}}, worker=ESCAPING, mem_gib=0.25, max_attempts=1)
    orch.submit("s", "1:a")
    orch.start_daemon(poll_s=0.1)
    escaped = _escaped_pid(orch)
    orch.run("cancel", "1")
    assert orch.wait_all_done(60) == {1: "cancelled"}
    assert not pid_alive(escaped)
    assert f"pid {escaped} " in orch.attempts(1)[0]["hunted"]


def test_a_double_forked_child_holding_gpu_memory_is_the_attempts_and_is_ended(orch: Orch) -> None:
    orch.write_suite("s", {"fork": {"escape": "double_fork_gpu", "hold_mib": 3072}}, worker=ESCAPING, mem_gib=4,
                     max_attempts=1)
    orch.submit("s", "1:a")
    orch.start_daemon(poll_s=0.1)
    escaped = _escaped_pid(orch)
    assert orch.wait_all_done(60) == {1: "succeeded"}
    assert not pid_alive(escaped)
    attempt = orch.attempts(1)[0]
    assert attempt["peak_mib"] >= 3072, attempt["peak_mib"]  # its memory, not a foreign process's
    assert f"pid {escaped} " in attempt["hunted"] and "by its wrapper" in attempt["hunted"], attempt["hunted"]


def test_a_full_disk_under_the_database_holds_decisions_it_does_not_make_them(tmp_path: Path) -> None:
    """state.db and the runs dir on a real 24 MiB tmpfs mounted for the test, filled while four
    attempts run and freed again; skipped where mounting is not allowed (CI runs as root)."""
    with small_tmpfs(tmp_path / "small", 24) as small, orch_env(tmp_path / "home") as orch:
        orch.db = small / "state.db"
        orch.env["ORCH_DB"] = str(orch.db)
        orch.socket = tmux_socket_name(orch.db)
        orch.write_suite("s", {"c": {"sim_mem_gib": 1, "sim_seconds": 7, "sim_ramp_s": 0.2}}, mem_gib=1,
                         max_attempts=1)
        orch.run("plan", "set", "2,2")
        orch.submit("s", "1:a 2:a 3:a 4:a")
        orch.run("daemon", "start", "--poll", "0.2", "--min-free-mib", "1", "--warn-free-mib", "2")
        orch.remember_daemon(int(orch.daemon_pid() or 0))
        def workers() -> list[int] | None:
            records = [json.loads(p.read_text()) for p in small.glob("runs/*/*/attempt-1/pid.json")]
            pids = [r["child_pid"] for r in records if "child_pid" in r]
            return pids if len(pids) == 4 else None
        worker_pids = wait_until(workers, 30, "four workers running")
        filler = small / "filler"
        fill_filesystem(filler)
        # full until every worker has reached its end (7 s of steps), then freed
        wait_until(lambda: all(time.time() - psutil.Process(pid).create_time() > 8.5 for pid in worker_pids
                               if pid_alive(pid)), 60, "the workers to reach their end")
        assert not orch.all_done()
        filler.unlink()
        assert orch.wait_all_done(60) == {
            1: "succeeded",
            2: "succeeded",
            3: "succeeded",
            4: "succeeded",
        }, [(a["outcome"], a["reason"]) for a in orch.attempts()]
        attempts = orch.attempts()
        assert [(a["job_id"], a["n"], a["outcome"]) for a in attempts] == [
            (j, 1, "succeeded") for j in (1, 2, 3, 4)
        ], [a["reason"] for a in attempts]
        assert all(a["peak_mib"] > 0 for a in attempts)


def test_state_db_removed_under_a_running_daemon_stops_it_and_the_cli_says_so(orch: Orch) -> None:
    orch.write_suite("s", {"c": {"sim_mem_gib": 1, "sim_seconds": 30}}, mem_gib=1, max_attempts=1)
    orch.submit("s", "1:a")
    pid = orch.start_daemon(poll_s=0.2)
    wait_until(lambda: orch.read(attempt_counts).launched, 30, "the job running")
    orch.db.unlink()
    # the daemon notices at its next pass and stops; until then, or after, one line each
    status = orch.run("daemon", "status", check=False)  # still running on it, or stopped already
    assert len(status.stdout.strip().splitlines()) == 1 and not status.stderr, status
    assert "was removed" in status.stdout
    wait_until(lambda: not pid_alive(pid), 30, "the daemon to stop by itself")
    assert "was removed while the daemon ran" in Path(str(orch.db) + ".daemon.log").read_text()
    status = orch.run("daemon", "status", check=False)  # exits as "not running" does
    assert not status.stderr and status.stdout.strip().splitlines() == [
        f"daemon: not running for {orch.db}; the last one stopped at {status.stdout.split(' at ', 1)[1].strip()}"]
    assert "was removed while the daemon ran" in status.stdout
    assert orch.run("daemon", "stop").stdout.startswith("no daemon is running")
    submitted = orch.run("submit", "--suite", "s", "--pairs", "2:a")
    assert "was removed while the daemon ran" in submitted.stderr and "Traceback" not in submitted.stderr


def test_daemon_stop_stops_a_daemon_still_running_on_a_removed_state_db(orch: Orch) -> None:
    orch.write_suite("s", {"c": {"sim_mem_gib": 1, "sim_seconds": 30}}, mem_gib=1, max_attempts=1)
    orch.submit("s", "1:a")
    pid = orch.start_daemon(poll_s=30)  # a long pass: it is still running on the removed file
    wait_until(lambda: orch.read(attempt_counts).launched, 30, "the job running")
    orch.db.unlink()
    submitted = orch.run("submit", "--suite", "s", "--pairs", "2:a", check=False)
    assert submitted.returncode == 1 and "Traceback" not in submitted.stderr
    assert submitted.stderr.strip().splitlines() == [
        f"orch: error: state database {orch.db} was removed while its daemon (pid {pid}) ran on it; the daemon "
        "stops by itself at its next pass, `orch daemon stop` stops it now"]
    assert not orch.db.exists()  # nothing was written
    stopped = orch.run("daemon", "stop")
    assert f"daemon (pid {pid}) stopped" in stopped.stdout and not pid_alive(pid)


def test_an_immutable_state_db_is_one_line_on_submit(orch: Orch) -> None:
    orch.write_suite("s", {"c": {"sim_mem_gib": 1}}, mem_gib=1)
    orch.submit("s", "1:a")
    if subprocess.run(["chattr", "+i", str(orch.db)], capture_output=True, check=False).returncode != 0:
        pytest.skip("chattr +i is not allowed here (needs root on a filesystem with attributes)")
    try:
        proc = orch.run("submit", "--suite", "s", "--pairs", "2:a", check=False)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"orch: error: cannot write state database {orch.db}: the file is read-only or immutable "
            f"(`lsattr {orch.db}`); make it writable (`chmod u+w`, `chattr -i`) or pass another --db"]
    finally:
        subprocess.run(["chattr", "-i", str(orch.db)], capture_output=True, check=False)


def read_or_empty(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def test_records_another_attempts_worker_forges_fail_no_one(orch: Orch) -> None:
    # The victim runs long enough for the forger to start and forge while it still runs, however
    # slow the machine (under load, starting the forger took longer than a 6 s victim's whole run,
    # and the forgery then landed on an attempt already closed)
    orch.write_suite("victim", {"v": {"sim_mem_gib": 1, "sim_seconds": 20, "sim_ramp_s": 0.2}}, mem_gib=1,
                     max_attempts=1)
    orch.write_suite("forger", {"f": {"corrupt": "forge_neighbours", "forge_s": 2.5, "hold_s": 0}},
                     worker=hostile_command(), mem_gib=0.25, max_attempts=1)
    orch.submit("victim", "1:a")
    orch.start_daemon(poll_s=0.1)
    wait_until(lambda: orch.read(attempt_counts).launched, 30, "the victim running")
    victim_dir = Path(str(orch.attempts(1)[0]["run_dir"]))
    orch.submit("forger", "1:a")
    wait_until(lambda: "forged" in read_or_empty(victim_dir / "exit.json"), 60, "the victim's records forged")
    assert orch.job_states()[1] == "running"  # forged while it ran: the case under test
    assert orch.wait_all_done(90) == {1: "succeeded", 2: "succeeded"}
    victim = orch.attempts(1)
    assert [a["outcome"] for a in victim] == ["succeeded"]  # once: its forged end was not taken for its own
    run_dir = Path(str(victim[0]["run_dir"]))
    # its own records, written at its end over the forged ones, are what was read
    assert json.loads((run_dir / "result.json").read_text())["status"] == "succeeded"
    assert "forged" not in (run_dir / "exit.json").read_text()
    assert "forged" not in (victim[0]["reason"] or "")


def test_a_result_json_of_ours_without_the_attempts_token_is_ignored(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic with a daemon ticked by hand: the record is forged between the worker's end
    and the pass that reads it."""
    with clock_daemon(tmp_path, monkeypatch) as d:
        d.orch.write_suite("s", {"c": {"sim_mem_gib": 1, "sim_seconds": 1, "sim_ramp_s": 0.1}}, mem_gib=1,
                           max_attempts=1)
        d.submit("s", "1:a")
        run_dir = Path(d.tick_until(lambda: d.running(1), 30, "the job running").run_dir)
        wait_until(lambda: (run_dir / "exit.json").exists(), 30, "the worker to end")  # no pass has read it
        assert json.loads((run_dir / "result.json").read_text())["token"]  # the worker's own carries it
        (run_dir / "result.json").write_text('{"status": "failed", "error": "forged", "metrics": {}}')
        d.tick_until(lambda: d.orch.job_states()[1] != "running", 30, "the attempt to close")
        attempt = d.attempt(1)
        assert attempt.outcome == "succeeded", attempt
        assert "result.json: not written by this attempt's worker" in str(attempt.reason)
