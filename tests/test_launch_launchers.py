"""Both launchers with real processes (and real tmux on a private socket): the wrapper's files,
the log, the env, argv passed verbatim, and killing whole process groups."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from e2e_helpers import wait_until

from orchestrator.errors import UsageError
from orchestrator.executors.base import Executor, LaunchSpec
from orchestrator.executors.factory import make_local_executor
from orchestrator.executors.process_groups import group_members, kill_process_group

REPO = Path(__file__).resolve().parents[1]
KINDS = [
    pytest.param(
        "tmux",
        marks=[
            pytest.mark.tmux,
            pytest.mark.skipif(shutil.which("tmux") is None, reason="no tmux"),
        ],
    ),
    "subprocess",
]


@pytest.fixture
def launcher(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Executor]:
    monkeypatch.chdir(REPO)  # so `python -m orchestrator.executors.wrapper.run` is importable anywhere
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    made = make_local_executor(request.param, socket_name=f"orch-test-{uuid.uuid4().hex[:10]}")
    yield made
    made.close()


def spec(tmp_path: Path, argv: list[str], env: dict[str, str] | None = None) -> LaunchSpec:
    return LaunchSpec(
        job_id=7,
        attempt_id=1,
        window_name="job7-E1-87-qnli",
        argv=argv,
        env=env or {},
        run_dir=tmp_path / "run",
    )


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


@pytest.mark.parametrize("launcher", KINDS, indirect=True)
def test_launch_records_pid_exit_log_env_and_verbatim_argv(
    launcher: Executor, tmp_path: Path
) -> None:
    tricky = ["a b", "it's", '"quoted"', "$(touch pwned)", "x; touch pwned2", "`id`", "$HOME", "*"]
    code = (
        "import json, os, sys; print(json.dumps({'argv': sys.argv[1:], "
        "'marker': os.environ.get('ORCH_TEST_MARKER')})); "
        "print('to stderr', file=sys.stderr); sys.exit(5)"
    )
    s = spec(tmp_path, [sys.executable, "-c", code, *tricky], {"ORCH_TEST_MARKER": "m-42 $x"})
    handle = launcher.submit(s)
    assert handle.executor == launcher.name

    wait_until(lambda: (s.run_dir / "exit.json").exists())
    exit_info = read_json(s.run_dir / "exit.json")
    assert exit_info["exit_code"] == 5 and exit_info["signal"] is None

    pid_info = read_json(s.run_dir / "pid.json")
    assert pid_info["pgid"] == pid_info["pid"]  # the wrapper leads its group
    assert {"create_time", "started_at", "child_pid"} <= pid_info.keys()
    assert handle.pid == pid_info["pid"]

    log_lines = (s.run_dir / "stdout.log").read_text().splitlines()
    assert "to stderr" in log_lines
    seen = json.loads(log_lines[0])
    assert seen == {"argv": tricky, "marker": "m-42 $x"}
    assert not list(s.run_dir.glob("pwned*"))


@pytest.mark.parametrize("launcher", KINDS, indirect=True)
def test_kill_process_group_escalates_to_sigkill(launcher: Executor, tmp_path: Path) -> None:
    # A worker that ignores SIGTERM and has a grandchild that ignores it too.
    code = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']); "
        "print('ready', flush=True); time.sleep(60)"
    )
    s = spec(tmp_path, [sys.executable, "-c", code])
    launcher.submit(s)
    wait_until(
        lambda: (
            "ready" in (s.run_dir / "stdout.log").read_text()
            if (s.run_dir / "stdout.log").exists()
            else False
        )
    )
    pgid = int(read_json(s.run_dir / "pid.json")["pgid"])
    assert len(group_members(pgid)) >= 3  # wrapper, worker, grandchild

    started = time.monotonic()
    assert kill_process_group(pgid, grace_s=0.5) is True
    assert time.monotonic() - started >= 0.5  # it waited out the grace period first
    assert group_members(pgid) == []
    assert kill_process_group(pgid, grace_s=0.5) is True  # idempotent on a gone group


@pytest.mark.parametrize("launcher", KINDS, indirect=True)
def test_sigterm_is_forwarded_and_recorded(launcher: Executor, tmp_path: Path) -> None:
    code = "import time; print('ready', flush=True); time.sleep(60)"
    s = spec(tmp_path, [sys.executable, "-c", code])
    launcher.submit(s)
    log = s.run_dir / "stdout.log"
    wait_until(lambda: log.exists() and "ready" in log.read_text())
    pid_info = read_json(s.run_dir / "pid.json")
    assert kill_process_group(int(pid_info["pgid"]), grace_s=5.0)
    wait_until(lambda: (s.run_dir / "exit.json").exists())
    exit_info = read_json(s.run_dir / "exit.json")
    assert exit_info["signal"] == 15 and exit_info["exit_code"] == 143
    assert not psutil.pid_exists(int(pid_info["child_pid"]))


def test_make_local_executor_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_LAUNCHER", "subprocess")
    assert make_local_executor(None, "s").name == "subprocess"
    with pytest.raises(UsageError, match="'screen'"):
        make_local_executor("screen", "s")
    monkeypatch.delenv("ORCH_LAUNCHER")
    monkeypatch.setenv("PATH", "")  # no tmux on PATH -> subprocess, with a warning
    assert make_local_executor(None, "s").name == "subprocess"


def test_refuses_to_kill_own_group() -> None:
    from orchestrator.errors import LauncherError

    with pytest.raises(LauncherError):
        kill_process_group(os.getpgid(0))
