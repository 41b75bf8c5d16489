"""The wrapper on its own: exit records for odd endings, and never waiting on orphans."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.attempts.rundir_reads import read_gpu_peak_mib
from orchestrator.executors.lost_marker import mark_lost
from orchestrator.executors.process_groups import kill_process_group
from orchestrator.executors.wrapper.run import EXIT_NOT_STARTED, EXIT_REFUSED, wrapper_argv
from orchestrator.rundir_files import RunDir

REPO = Path(__file__).resolve().parents[1]


def run_wrapper(
    run_dir: Path, argv: list[str], timeout_s: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        wrapper_argv(run_dir, argv),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        start_new_session=True,
        check=False,
    )


def exit_info(run_dir: Path) -> dict[str, object]:
    return json.loads((run_dir / "exit.json").read_text())


def test_echoes_output_and_appends_to_the_log(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for text in ("first", "second"):
        (run_dir / "pid.json").unlink(missing_ok=True)  # pid.json is one wrapper's claim on the dir
        done = run_wrapper(run_dir, [sys.executable, "-c", f"print({text!r})"])
        assert done.returncode == 0 and text in done.stdout
    assert (run_dir / "stdout.log").read_text().splitlines() == ["first", "second"]


def test_missing_command_is_recorded(tmp_path: Path) -> None:
    done = run_wrapper(tmp_path, ["/nonexistent/worker", "--x"])
    assert done.returncode == EXIT_NOT_STARTED
    assert exit_info(tmp_path)["exit_code"] == EXIT_NOT_STARTED
    assert "cannot start" in (tmp_path / "stdout.log").read_text()


def test_worker_killed_by_a_signal_is_recorded(tmp_path: Path) -> None:
    done = run_wrapper(
        tmp_path, [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    )
    assert done.returncode == 137
    assert exit_info(tmp_path) | {"ended_at": None} == {
        "exit_code": 137,
        "signal": 9,
        "signal_name": "SIGKILL",
        "received": [],
        "forwarded": [],
        "ended_at": None,
        "leftovers": [],
        "tracking": ["subreaper"],  # no cgroup was given (ORCH_CGROUP)
        "token": "",  # none was given (ORCH_ATTEMPT_TOKEN)
        "oom_kills": None,  # no cgroup to read memory.events from
    }


def test_orphan_holding_the_pipe_does_not_delay_the_exit_record(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(20)']); print('parent done')"
    )
    started = time.monotonic()
    done = run_wrapper(tmp_path, [sys.executable, "-c", code])
    assert done.returncode == 0
    assert time.monotonic() - started < 10
    assert exit_info(tmp_path)["exit_code"] == 0
    pid_info = json.loads((tmp_path / "pid.json").read_text())
    assert kill_process_group(int(pid_info["pgid"]), grace_s=0.1)  # the orphan


def test_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.executors.wrapper.run", "--run-dir"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "usage" in done.stderr


def test_everything_written_under_the_wrapper_is_owner_only(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    code = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('x'); print('hi')"
    done = subprocess.run(
        wrapper_argv(run_dir, [sys.executable, "-c", code, str(run_dir / "worker-file")]),
        cwd=REPO, capture_output=True, text=True, timeout=30, start_new_session=True,
        check=False, umask=0o022,  # what a login shell usually has
    )
    assert done.returncode == 0
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run_dir.iterdir()}
    assert set(modes) == {"pid.json", "exit.json", "stdout.log", "provenance.json", "worker-file"}
    assert set(modes.values()) == {0o600}, modes


def _wait_for_child(run_dir: Path, deadline_s: float = 20.0) -> dict[str, object]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            record = json.loads((run_dir / "pid.json").read_text())
        except (FileNotFoundError, ValueError):
            record = {}
        if record.get("child_pid"):
            return record  # handlers are installed before child_pid is recorded
        time.sleep(0.02)
    raise AssertionError("the wrapper never recorded its worker")


def test_signals_received_and_forwarded_are_recorded(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        wrapper_argv(tmp_path, [sys.executable, "-c", "import time; time.sleep(30)"]),
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    _wait_for_child(tmp_path)
    proc.send_signal(signal.SIGHUP)  # the wrapper alone, as when its terminal goes away
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    record = exit_info(tmp_path)
    assert record["received"] == ["SIGHUP"]
    assert record["forwarded"] == ["SIGTERM"]
    assert record["signal_name"] == "SIGTERM"


def _blocking_the_forwarded_signals() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP, signal.SIGINT})


def test_a_wrapper_started_with_signals_blocked_still_stops_its_worker(tmp_path: Path) -> None:
    # as under a tmux server started by a process that had SIGTERM blocked: every pane inherits
    # the mask, and a worker started that way ran on to its own end after a cancel
    proc = subprocess.Popen(
        wrapper_argv(tmp_path, [sys.executable, "-c", "import time; time.sleep(60)"]),
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=_blocking_the_forwarded_signals,
    )
    _wait_for_child(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM  # not the worker's own end, 60 s later
    assert exit_info(tmp_path)["signal_name"] == "SIGTERM"


def test_a_worker_failing_by_itself_records_no_signal(tmp_path: Path) -> None:
    done = run_wrapper(tmp_path, [sys.executable, "-c", "raise SystemExit(143)"])
    assert done.returncode == 143
    assert exit_info(tmp_path)["received"] == []


def test_a_lost_marker_stops_the_worker_from_starting(tmp_path: Path) -> None:
    (tmp_path / RunDir.LOST_MARKER).write_text("")  # the daemon declared the attempt lost first
    done = run_wrapper(tmp_path, [sys.executable, "-c", f"open({str(tmp_path / 'ran')!r}, 'w')"])
    assert done.returncode == EXIT_REFUSED and "declared lost" in done.stderr
    assert not (tmp_path / "ran").exists()
    assert not (tmp_path / "pid.json").exists() and not (tmp_path / "exit.json").exists()


def test_a_second_wrapper_on_one_run_dir_refuses(tmp_path: Path) -> None:
    (tmp_path / "pid.json").write_text('{"pid": 1}')
    done = run_wrapper(tmp_path, [sys.executable, "-c", f"open({str(tmp_path / 'ran')!r}, 'w')"])
    assert done.returncode == EXIT_REFUSED
    assert not (tmp_path / "ran").exists()
    assert json.loads((tmp_path / "pid.json").read_text()) == {"pid": 1}


def test_marking_lost_while_real_wrappers_start(tmp_path: Path) -> None:
    """The daemon marks the attempt lost at various moments of the wrapper's start-up: when it
    wins, the worker never ran; when it loses, pid.json is there."""
    wins = 0
    for trial in range(8):
        run_dir = tmp_path / f"attempt-{trial}"
        run_dir.mkdir()
        ran = run_dir / "ran"
        proc = subprocess.Popen(
            wrapper_argv(run_dir, [sys.executable, "-c", f"open({str(ran)!r}, 'w')"]),
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        time.sleep(trial * 0.04)  # spread the mark over the wrapper's start-up
        lost = mark_lost(run_dir)
        proc.wait(timeout=30)
        if lost:
            wins += 1
            assert not ran.exists() and proc.returncode == EXIT_REFUSED
        else:
            assert (run_dir / "pid.json").exists()
    assert wins >= 1  # the first mark lands before python has even started


def test_the_wrapper_starts_without_site_packages_and_still_samples_the_gpu(tmp_path: Path) -> None:
    # The wrapper runs by path under `python -S` (its start-up is on every hand-off's path);
    # once the worker runs it loads site-packages, so its GPU peak sampler still works.
    sim_dir, run_dir = tmp_path / "sim", tmp_path / "run"
    argv = wrapper_argv(run_dir, [])
    assert argv[1:3] == ["-S", str(REPO / "orchestrator" / "executors" / "wrapper" / "run.py")]
    code = (
        "import json, os, time, psutil\n"
        "from pathlib import Path\n"
        "from orchestrator.gpu.sim import gpu_dir\n"
        f"d = gpu_dir(Path({str(sim_dir)!r}), 0)\n"
        "d.mkdir(parents=True, exist_ok=True)\n"
        "record = {'pid': os.getpid(), 'create_time': psutil.Process().create_time(), 'used_mib': 3000}\n"
        "(d / f'{os.getpid()}.json').write_text(json.dumps(record))\n"
        "time.sleep(2.5)\n"
    )
    env = {**os.environ, "ORCH_GPU_BACKEND": "sim", "ORCH_SIM_GPUS": "1x24GiB", "ORCH_SIM_DIR": str(sim_dir)}
    done = subprocess.run(wrapper_argv(run_dir, [sys.executable, "-c", code]), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=30, start_new_session=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert read_gpu_peak_mib(run_dir) == 3000
    pid_record = json.loads((run_dir / "pid.json").read_text())
    assert abs(pid_record["create_time"] - time.time()) < 60  # read from /proc, as psutil gives it


def _zombie_children(pid: int) -> list[int]:
    zombies = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == b"Z" and int(fields[1]) == pid:
                zombies.append(int(entry))
    return zombies


def test_orphans_reparented_to_the_wrapper_are_reaped_while_the_worker_runs(tmp_path: Path) -> None:
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    orphan = os.fork()\n"
        "    if orphan == 0:\n"
        "        time.sleep(0.2); os._exit(0)\n"  # an orphan of the wrapper once its parent is gone
        "    print(f'orphan {orphan}', flush=True); os._exit(0)\n"
        "os.wait(); print('forked', flush=True); time.sleep(10)\n"
    )
    proc = subprocess.Popen(wrapper_argv(tmp_path, [sys.executable, "-c", code]), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None
        first, second = proc.stdout.readline(), proc.stdout.readline()
        assert first.startswith(b"orphan ") and b"forked" in second, (first, second)
        orphan = int(first.split()[1])
        # gone from the process table only once reaped: unreaped, it would stay a zombie of the wrapper
        deadline = time.monotonic() + 8
        while os.path.exists(f"/proc/{orphan}") and time.monotonic() < deadline:
            time.sleep(0.1)  # polling the process table for the reaper's pass
        assert not os.path.exists(f"/proc/{orphan}"), _zombie_children(proc.pid)
        assert proc.poll() is None  # reaped while the worker runs, not by the wrapper's end
    finally:
        proc.kill()
        proc.wait()
