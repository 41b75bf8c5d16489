"""One runs folder reached by two paths (a bind mount): an attempt's processes started through
one path are found, and ended, by a daemon whose database is reached through the other; and
processes marked the way an earlier orch marked them are still found after an upgrade."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.attempts.containment import (
    StrayHunter,
    legacy_runs_key,
    runs_key,
    tracking_env,
)
from orchestrator.clock import SystemClock
from orchestrator.executors.wrapper.strays import MARK_VAR


@pytest.fixture
def bound_twice(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(the runs folder, the same folder bind-mounted at a second path)."""
    first, second = tmp_path / "runs", tmp_path / "elsewhere"
    first.mkdir()
    second.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(first), str(second)], capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"bind mounts need privileges here: {mounted.stderr.decode().strip()}")
    try:
        yield first, second
    finally:
        subprocess.run(["umount", str(second)], check=False)


def _marked_sleeper(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            env={**os.environ, **env}, start_new_session=True)


def _ended_by(hunter: StrayHunter, attempt_id: int, proc: subprocess.Popen[bytes], deadline_s: float = 30) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        hunter.new_pass()
        if hunter.stop(attempt_id) and proc.poll() is not None:
            return True
        time.sleep(0.1)  # the daemon's next pass
    return False


def test_one_folder_through_two_paths_has_one_key(bound_twice: tuple[Path, Path]) -> None:
    first, second = bound_twice
    assert runs_key(first) == runs_key(second)
    assert legacy_runs_key(first) != legacy_runs_key(second)  # what the old key missed


def test_strays_started_through_one_path_are_ended_through_the_other(bound_twice: tuple[Path, Path]) -> None:
    first, second = bound_twice
    stray = _marked_sleeper(tracking_env(first, 7, cgroup=False))
    try:
        hunter = StrayHunter(SystemClock(), second)
        assert _ended_by(hunter, 7, stray)
        assert str(stray.pid) in (hunter.hunted(7) or "")
    finally:
        stray.kill()
        stray.wait()


def test_strays_marked_by_an_earlier_orch_are_still_found(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    stray = _marked_sleeper({MARK_VAR: f"{legacy_runs_key(runs)}-3"})
    try:
        assert _ended_by(StrayHunter(SystemClock(), runs), 3, stray)
    finally:
        stray.kill()
        stray.wait()
