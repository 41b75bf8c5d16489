"""The wake FIFO: a wrapper's poke reaches a waiting daemon at once, and every failure of it
is harmless (no daemon, a planted file, a full pipe)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

from orchestrator.executors.wake import WakeChannel, poke, wait_gone, wake_path
from orchestrator.executors.wrapper.run import wrapper_argv

REPO = Path(__file__).resolve().parents[1]


def run_dir_in(runs: Path, n: int = 1) -> Path:
    run_dir = runs / "suite" / "000001-job" / f"attempt-{n}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def test_poke_without_a_daemon_is_harmless(tmp_path: Path) -> None:
    run_dir = run_dir_in(tmp_path / "runs")
    assert poke(run_dir) is False  # no FIFO at all
    os.mkfifo(wake_path(tmp_path / "runs"), 0o600)
    assert poke(run_dir) is False  # a FIFO nobody reads: ENXIO, never a block


def test_poke_never_writes_into_a_planted_regular_file(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run_dir = run_dir_in(runs)
    wake_path(runs).write_text("")
    assert poke(run_dir) is False
    assert wake_path(runs).read_text() == ""


def test_channel_replaces_a_planted_file_and_hears_pokes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first, second = run_dir_in(runs, 1), run_dir_in(runs, 2)
    wake_path(runs).write_text("not a fifo")
    channel = WakeChannel(runs)
    try:
        assert channel.open()
        assert stat.S_ISFIFO(os.lstat(wake_path(runs)).st_mode)
        assert channel.wait(0.05) == set()  # nothing poked: times out
        assert poke(first) and poke(second)
        assert channel.wait(1.0) == {first, second}
        assert channel.drain() == set()
    finally:
        channel.close()
    assert poke(first) is False  # the daemon is gone


def test_wait_returns_as_soon_as_a_poke_arrives(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run_dir = run_dir_in(runs)
    channel = WakeChannel(runs)
    assert channel.open()
    try:
        timer = threading.Timer(0.2, poke, [run_dir])
        timer.start()
        started = time.monotonic()
        assert channel.wait(10.0) == {run_dir}
        assert time.monotonic() - started < 5.0
        timer.join()
    finally:
        channel.close()


def test_garbage_lines_are_only_paths_never_more(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    channel = WakeChannel(runs)
    assert channel.open()
    try:
        fd = os.open(wake_path(runs), os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"\n\n/x/y\xff\npartial")
        assert channel.drain() == {Path(os.fsdecode(b"/x/y\xff"))}
        os.write(fd, b"-line\n")
        assert channel.drain() == {Path("partial-line")}
        os.close(fd)
    finally:
        channel.close()


def test_the_wrapper_pokes_after_its_exit_record(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run_dir = run_dir_in(runs)
    channel = WakeChannel(runs)
    assert channel.open()
    try:
        done = subprocess.run(wrapper_argv(run_dir, [sys.executable, "-c", "pass"]), cwd=REPO,
                              capture_output=True, timeout=60, start_new_session=True, check=False)
        assert done.returncode == 0
        assert channel.drain() == {run_dir}
        assert (run_dir / "exit.json").exists()
    finally:
        channel.close()


def test_wait_gone_follows_the_recorded_process_only(tmp_path: Path) -> None:
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        create_time = psutil.Process(proc.pid).create_time()
        assert wait_gone(proc.pid, create_time + 100.0, 5.0) is True  # another process: not waited on
        assert wait_gone(proc.pid, create_time, 0.01) is False  # still running
        proc.terminate()
        threading.Thread(target=proc.wait).start()  # reaped, as tmux reaps a pane's process
        assert wait_gone(proc.pid, create_time, 30.0) is True
    finally:
        proc.kill()
        proc.wait()
