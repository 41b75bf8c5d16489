"""`tmux kill-server` while attempts run: a new server numbers its windows from the start again,
so a window id alone may name another attempt's window. A window is closed or believed only when
its name carries the attempt's identity; the workers the hang-up stopped are requeued unchanged
and not counted. Real tmux on a private socket; the end-to-end case runs the real daemon."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import Orch, wait_until
from rows_helpers import attempt_of

from orchestrator.executors.base import LaunchSpec
from orchestrator.executors.tmux import TmuxExecutor
from orchestrator.rundir_files import TOKEN_VAR

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs the tmux binary"),
]
REPO = Path(__file__).resolve().parents[1]
WAIT_FOREVER = "import time\nwhile True: time.sleep(1)"


def _spec(tmp_path: Path, attempt_id: int, token: str) -> LaunchSpec:
    return LaunchSpec(job_id=attempt_id, attempt_id=attempt_id, window_name=f"job{attempt_id}", env={TOKEN_VAR: token},
                      argv=[sys.executable, "-c", WAIT_FOREVER], run_dir=tmp_path / f"a{attempt_id}")


def test_a_window_id_reused_by_a_new_server_is_neither_closed_nor_believed(tmux: TmuxExecutor, tmp_path: Path) -> None:
    old = tmux.submit(_spec(tmp_path, 1, "aaaa1111"))
    old_attempt = attempt_of(id=1, job_id=1, executor="tmux", executor_id=old.executor_id, token="aaaa1111")
    wait_until(lambda: (tmp_path / "a1" / "pid.json").exists(), 30, "the first wrapper")
    subprocess.run(["tmux", "-L", tmux.socket_name, "kill-server"], check=True, capture_output=True)
    new = tmux.submit(_spec(tmp_path, 2, "bbbb2222"))  # the new server: the executor notices it
    assert new.executor_id == old.executor_id  # tmux gives the id again: identity must come from elsewhere
    wait_until(lambda: (tmp_path / "a2" / "pid.json").exists(), 30, "the second wrapper")
    assert tmux.started_alive(old_attempt) is False  # that pane is not the old attempt's
    tmux.cleanup([old_attempt])  # the old attempt ended: its window must be closed, not the new one
    assert tmux.window_alive(str(new.executor_id))
    new_attempt = attempt_of(id=2, job_id=2, executor="tmux", executor_id=new.executor_id, token="bbbb2222")
    assert tmux.started_alive(new_attempt) is True
    tmux.cleanup([new_attempt])
    assert not tmux.window_alive(str(new.executor_id))




def test_tmux_kill_server_loses_nothing_and_counts_nothing(orch: Orch) -> None:
    jobs = 4
    # long enough that the family's first jobs pass step K, and the other two stack beside them,
    # well before the first ones end, under load too (at 6 s a loaded run ended them first)
    orch.write_suite("k", {"k": {"sim_mem_gib": 2, "sim_seconds": 14}}, mem_gib=3, max_attempts=1)
    orch.submit("k", " ".join(f"{seed}:glue_rte" for seed in range(jobs)), "--gpu-plan", "2,2")
    orch.start_daemon()
    wait_until(lambda: len([a for a in orch.live_attempts() if a.pgid]) == jobs, 60, "every job running")
    subprocess.run(["tmux", "-L", orch.socket, "kill-server"], check=True, capture_output=True)
    done = orch.wait_all_done(120)
    assert done == {job: "succeeded" for job in range(1, jobs + 1)}
    for job in range(1, jobs + 1):  # stopped by the hang-up, then one that ran to its end (a worker
        # still starting up when the server went ignores the hang-up and runs on)
        attempts = orch.json("show", str(job))["attempts"]
        assert [a["outcome"] for a in attempts] in (["lost", "succeeded"], ["succeeded"]), (job, attempts)
        assert all("signal orch did not send" in a["reason"] for a in attempts[:-1])
    assert orch.daemon_pid() is not None


def test_a_launch_batch_cut_short_by_a_daemon_death_is_requeued_uncounted(orch: Orch) -> None:
    """The daemon dies (as a SIGKILL would) once tmux opened a batch's windows and before it
    recorded them: those attempts never started a worker, so they are lost without counting."""
    jobs = 4
    orch.write_suite("b", {"b": {"sim_mem_gib": 1, "sim_seconds": 1}}, mem_gib=2, max_attempts=1)
    orch.submit("b", " ".join(f"{seed}:glue_rte" for seed in range(jobs)), "--gpu-plan", "2,2")
    orch.start_daemon_dying_at("mid_launch_batch")
    assert len(orch.attempts()) >= 2  # claimed, in one batch
    orch.start_daemon()
    assert orch.wait_all_done(120) == {job: "succeeded" for job in range(1, jobs + 1)}
    lost = [a for a in orch.attempts() if a["outcome"] == "lost"]
    assert len(lost) >= 2 and all("launch never completed" in a["reason"] for a in lost)


def test_a_folder_named_with_a_tmux_format_is_only_a_name(tmux: TmuxExecutor, tmp_path: Path) -> None:
    """tmux expands formats in a window's start folder: `#(...)` in a folder name would run."""
    folder = tmp_path / "exp #(touch ran) #{pane_id}"
    folder.mkdir()
    code = "import os; print('cwd=' + os.getcwd())"
    spec = LaunchSpec(job_id=1, attempt_id=1, window_name="job1", argv=[sys.executable, "-c", code],
                      run_dir=tmp_path / "run", cwd=folder)
    tmux.submit(spec)
    wait_until(lambda: (tmp_path / "run" / "exit.json").exists(), 30, "the worker to end")
    assert f"cwd={folder}" in (tmp_path / "run" / "stdout.log").read_text()
    assert not list(tmp_path.rglob("ran")) and not (REPO / "ran").exists()


def test_a_newline_in_the_state_folder_or_working_directory_is_refused_at_start(tmp_path: Path) -> None:
    for db_dir, cwd in ((tmp_path / "a\nb", tmp_path), (tmp_path / "ok", tmp_path / "c\nd")):
        db_dir.mkdir(exist_ok=True)
        cwd.mkdir(exist_ok=True)
        env = {**os.environ, "ORCH_DB": str(db_dir / "state.db"), "ORCH_GPU_BACKEND": "sim", "ORCH_SIM_GPUS": "1x8GiB",
               "ORCH_SIM_DIR": str(tmp_path / "sim"), "PYTHONPATH": str(REPO)}
        proc = subprocess.run([sys.executable, "-m", "orchestrator", "daemon", "start"], env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:  # started after all: stopped again before the test fails
            subprocess.run([sys.executable, "-m", "orchestrator", "daemon", "stop"], env=env, cwd=cwd,
                           capture_output=True, timeout=60, check=False)
        assert proc.returncode == 2 and "line break" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert not (db_dir / "state.db").exists()  # nothing written


def test_sighup_is_logged_and_survived(orch: Orch) -> None:
    orch.write_suite("h", {"h": {"sim_mem_gib": 1, "sim_seconds": 1}}, mem_gib=2)
    pid = orch.start_daemon()
    os.kill(pid, signal.SIGHUP)
    log = Path(str(orch.db) + ".daemon.log")
    wait_until(lambda: "SIGHUP received" in log.read_text(), 30, "the hang-up in the daemon's log")
    orch.submit("h", "1:a")
    assert orch.wait_all_done(60) == {1: "succeeded"}
    assert orch.daemon_pid() == pid


def test_a_launch_file_left_by_a_killed_daemon_is_private_and_swept(orch: Orch, tmp_path: Path) -> None:
    """The file of a batch's tmux commands holds the jobs' environment (suite secrets, attempt
    tokens): it is written 0600 in the runs dir, never in the shared temp folder, and the next
    daemon removes one a killed daemon left."""
    orch.write_suite("s", {"s": {"sim_mem_gib": 1, "sim_seconds": 1}}, mem_gib=2, env={"API_TOKEN": "secret-value"})
    orch.submit("s", "1:a 2:a", "--gpu-plan", "2,2")
    temp = tmp_path / "tmp"
    temp.mkdir()
    orch.env["TMPDIR"] = str(temp)
    orch.start_daemon_dying_at("launch_file_written")
    runs = orch.db.parent / "runs"
    left = list(runs.glob(".launch-*.conf"))
    assert len(left) == 1 and left[0].stat().st_mode & 0o777 == 0o600 and b"secret-value" in left[0].read_bytes()
    assert not list(temp.glob("*launch*"))
    orch.start_daemon()
    wait_until(lambda: not list(runs.glob(".launch-*.conf")), 30, "the left launch file to be swept")
    assert orch.wait_all_done(60) == {1: "succeeded", 2: "succeeded"}
