"""/proc/<pid>/stat read once: the same start time and parent as psutil's, zombies told apart."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from orchestrator.procstat import cpu_seconds, create_time_s, read_stat, rss_bytes
from tests.e2e_helpers import wait_until


def test_stat_gives_psutils_create_time_and_parent() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        stat = read_stat(child.pid)
        assert stat is not None and stat.ppid == os.getpid() and stat.state != "Z"
        created_s = create_time_s(stat)
        assert created_s is not None
        assert abs(created_s - psutil.Process(child.pid).create_time()) < 0.011
        self_stat = read_stat("self")
        assert self_stat is not None and self_stat.ppid == os.getppid()
    finally:
        child.kill()
        child.wait()


def test_a_zombie_reads_as_one_and_a_gone_pid_as_none() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_until(lambda: (stat := read_stat(child.pid)) is not None and stat.state == "Z")  # exited, not reaped
    child.wait()
    assert read_stat(child.pid) is None


def test_cpu_and_rss_match_psutils() -> None:
    code = "x = bytearray(64 * 2**20)\nimport time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ninput()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        wait_until(lambda: sum(psutil.Process(child.pid).cpu_times()[:2]) >= 0.3)
        stat = read_stat(child.pid)
        assert stat is not None
        proc = psutil.Process(child.pid)
        times, rss = proc.cpu_times(), proc.memory_info().rss
        assert abs(cpu_seconds(stat) - (times.user + times.system)) < 0.05
        assert rss_bytes(stat) >= 64 * 2**20 and abs(rss_bytes(stat) - rss) < 2**20
    finally:
        child.kill()
        child.wait()
