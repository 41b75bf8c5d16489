"""Everything orch creates is the user's alone: dirs 0700, files 0600, a private tmux socket."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from e2e_helpers import Orch, requires_tmux

from orchestrator.executors.run_dir import make_private_dirs, prepare_run_dir

GROUP_OTHER = stat.S_IRWXG | stat.S_IRWXO




def _too_open(root: Path) -> list[str]:
    """Every path under `root` (itself included) whose mode is not 0700 (dirs) / 0600 (files)."""
    bad: list[str] = []
    for path in [root, *root.rglob("*")]:
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            continue
        want = 0o700 if stat.S_ISDIR(mode) else 0o600
        if stat.S_IMODE(mode) != want:
            bad.append(f"{path.relative_to(root.parent)} {oct(stat.S_IMODE(mode))}")
    return bad


def test_prepare_run_dir_makes_missing_parents_private(tmp_path: Path) -> None:
    tmp_path.chmod(0o751)
    old_umask = os.umask(0o022)  # the usual login umask, which would make parents 0755
    try:
        run_dir = tmp_path / "runs" / "suite" / "job" / "attempt-1"
        prepare_run_dir(run_dir, {"a": 1}, {})
        make_private_dirs(tmp_path / "runs" / "suite" / "other")
    finally:
        os.umask(old_umask)
    assert _too_open(tmp_path / "runs") == []
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o751  # an existing parent is left alone


@requires_tmux
@pytest.mark.tmux
def test_a_sim_job_through_the_daemon_leaves_only_private_files(orch: Orch) -> None:
    old_umask = os.umask(0o022)  # the CLI and daemon inherit the usual umask; orch must not rely on it
    try:
        orch.write_suite("sec", {"sec": {"sim_mem_gib": 1, "sim_seconds": 1}}, mem_gib=2)
        orch.submit("sec", "1:a")
        orch.start_daemon()
        assert orch.wait_all_done(60) == {1: "succeeded"}
        # asked while the daemon runs: a daemon that stops with nothing running takes its server along
        socket_path = subprocess.run(
            ["tmux", "-L", orch.socket, "display-message", "-p", "#{socket_path}"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        orch.stop_daemon()
    finally:
        os.umask(old_umask)
    runs = orch.root / "runs"
    names = {p.name for p in runs.rglob("*")}
    assert {"stdout.log", "progress.jsonl", "pid.json", "exit.json", "result.json", "config.yaml"} <= names
    assert _too_open(runs) == []
    db_files = list(orch.root.glob("state.db*"))
    assert db_files
    assert [p.name for p in db_files if stat.S_IMODE(p.stat().st_mode) != 0o600] == []
    socket_dir = Path(socket_path).parent
    assert stat.S_IMODE(socket_dir.stat().st_mode) & GROUP_OTHER == 0, oct(socket_dir.stat().st_mode)
    assert socket_dir.stat().st_uid == os.getuid()


@requires_tmux
@pytest.mark.tmux
def test_sim_dir_is_private(orch: Orch) -> None:
    old_umask = os.umask(0o022)
    try:
        orch.write_suite("sec", {"sec": {"sim_mem_gib": 1, "sim_seconds": 1}}, mem_gib=2)
        orch.submit("sec", "1:a")
        orch.start_daemon()
        assert orch.wait_all_done(60) == {1: "succeeded"}
    finally:
        os.umask(old_umask)
    assert _too_open(orch.root / "sim") == []
