"""Process trees kept between passes: a fresh scan when asked for, or when the GPUs report a
process the last scan did not see."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from orchestrator.gpu.attribution import ProcessTrees, TreeMembers


@pytest.fixture
def parent() -> Iterator[subprocess.Popen[bytes]]:
    # a parent that starts a child when its stdin says so
    code = ("import subprocess, sys\nsys.stdin.readline()\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(c.pid, flush=True)\nsys.stdin.readline()\nc.kill()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    yield proc
    proc.kill()
    proc.wait()


def _spawn_child(proc: subprocess.Popen[bytes]) -> int:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    return int(proc.stdout.readline())


def test_a_kept_scan_is_used_until_a_fresh_one_is_asked_for(parent: subprocess.Popen[bytes]) -> None:
    trees = ProcessTrees()
    trees.new_pass()
    assert trees.pids(parent.pid) == {parent.pid}
    child = _spawn_child(parent)
    trees.new_pass()
    assert trees.pids(parent.pid, fresh=False) == {parent.pid}  # the last pass's scan
    assert trees.pids(parent.pid, fresh=True) == {parent.pid, child}
    trees.new_pass()
    assert trees.pids(parent.pid, fresh=False) == {parent.pid, child}


def test_a_process_the_gpus_report_and_the_scan_missed_makes_a_new_scan(parent: subprocess.Popen[bytes]) -> None:
    trees = ProcessTrees()
    trees.new_pass()
    assert trees.pids(parent.pid) == {parent.pid}
    child = _spawn_child(parent)
    trees.new_pass(reported_pids=[child])
    assert trees.pids(parent.pid, fresh=False) == {parent.pid, child}


def test_tree_members_are_the_root_and_its_descendants_among_the_reported(parent: subprocess.Popen[bytes]) -> None:
    child = _spawn_child(parent)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tree = TreeMembers(parent.pid)
        reported = [parent.pid, child, stranger.pid, 999_999_999]
        assert tree.among(reported) == {parent.pid, child}
        assert tree.among(reported) == {parent.pid, child}  # the stranger is now known outside
        assert TreeMembers(stranger.pid).among(reported) == {stranger.pid}
    finally:
        stranger.kill()
        stranger.wait()


def test_a_descendant_in_another_session_is_found_by_its_ancestry() -> None:
    # the root leads its own session; its child leaves it (setsid): only its ancestry says whose it is
    code = ("import os, subprocess, sys\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
            "print(c.pid, flush=True)\nsys.stdin.readline()\nc.kill()\n")
    root = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert root.stdout is not None
        child = int(root.stdout.readline())
        tree = TreeMembers(root.pid)
        assert tree.among([child]) == {child}
    finally:
        root.kill()
        root.wait()


def test_tree_members_are_none_once_the_root_is_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert TreeMembers(proc.pid).among([proc.pid]) == frozenset()


def test_pid_zero_is_never_a_member_even_of_our_own_session() -> None:
    # the sim GPUs report foreign memory as pid 0, and getsid(0) names the caller's own session
    tree = TreeMembers(os.getpid())
    tree._root_sid = os.getsid(0)
    assert tree.among([0]) == frozenset()
