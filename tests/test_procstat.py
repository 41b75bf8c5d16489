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
    code = (
        "x = bytearray(64 * 2**20)\nimport time\nt = time.process_time()\nwhile "
        "time.process_time() - t < 0.3: pass\ninput()"
    )
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


def test_one_rule_says_whether_a_pid_is_the_recorded_process() -> None:
    """procstat.process_matches is the only "is this still our process" check: the daemon's
    (attempts/reconcile.py), the wake poke's wait (executors/wake.py) and the simulated GPUs'
    holders (gpu/sim_files.py) all give the same answer, within one tolerance."""
    from orchestrator.attempts.reconcile import process_matches as reconcile_matches
    from orchestrator.gpu.sim_files import holder_alive
    from orchestrator.procstat import SAME_PROCESS_TOLERANCE_S, process_matches, process_start

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        start = process_start(child.pid)
        assert start is not None and start[1] is False
        created_s = start[0]
        half = SAME_PROCESS_TOLERANCE_S / 2
        for recorded_s, same in ((created_s, True), (created_s + half, True), (created_s - half, True),
                                 (created_s + 2 * SAME_PROCESS_TOLERANCE_S, False)):
            # the simulated GPUs' holders were judged with 0.05 s before: a holder read half a
            # second off (a boot time read a second apart) was dropped as dead
            assert process_matches(child.pid, recorded_s) is same
            assert reconcile_matches(child.pid, recorded_s) is same
            assert holder_alive(child.pid, recorded_s) is same
        for pid, recorded in ((True, created_s), (0, created_s), (child.pid, None), (child.pid, "x")):
            assert process_matches(pid, recorded) is False  # values from files are checked
    finally:
        child.kill()
        child.wait()
    assert process_matches(child.pid, created_s) is False
