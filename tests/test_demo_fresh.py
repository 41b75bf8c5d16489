"""`orch demo` starts fresh every run and, like the daemon, leaves nothing running behind it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from orchestrator.daemon.state import tmux_socket_name
from tests.conftest import REPO_ROOT
from tests.e2e_helpers import orch_env, requires_tmux, wait_until

pytestmark = [requires_tmux, pytest.mark.slow]


def tmux_server_running(db: Path) -> bool:
    probe = subprocess.run(["tmux", "-L", tmux_socket_name(db), "ls"], capture_output=True, check=False)
    return probe.returncode == 0


def orch_processes_for(db: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "orchestrator" in cmdline and str(db) in cmdline:
            found.append(proc)
    return found


def demo_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update({"ORCH_GPU_BACKEND": "sim", "ORCH_SIM_GPUS": "2x24GiB", "TMPDIR": str(tmp_path),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))})
    return env


def run_demo(tmp_path: Path) -> tuple[str, Path]:
    env = demo_env(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "demo", "--pairs", "1:glue_rte", "--timeout", "240"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    match = re.search(r"demo database: (\S+)", done.stdout)
    assert match, done.stdout[:2000]
    return done.stdout, Path(match.group(1))


def test_each_demo_starts_fresh_and_leaves_nothing_running(tmp_path: Path) -> None:
    first_out, first_db = run_demo(tmp_path)
    second_out, second_db = run_demo(tmp_path)
    assert first_db != second_db
    for out, db in ((first_out, first_db), (second_out, second_db)):
        assert db.exists() and db.parent.parent == tmp_path  # a new folder in the temp dir
        assert f"queued 3 demo job(s) in {db}" in out
        assert "demo done: 3 succeeded" in out
        # piped: a line per event, no dashboard frames
        assert re.search(r"^\d\d:\d\d:\d\d job 1: attempt 1 started on GPU \d", out, flags=re.M), out[:2000]
        assert len(re.findall(r"^\d\d:\d\d:\d\d job \d: attempt 1 succeeded", out, flags=re.M)) == 3
        assert "╭" not in out and "running (" not in out
        assert not tmux_server_running(db)
        assert orch_processes_for(db) == []
    assert not (tmp_path / "state.db").exists()  # nothing written where the demo was run


def test_a_stopped_daemon_takes_its_tmux_server_along_unless_workers_run(tmp_path: Path) -> None:
    with orch_env(tmp_path) as orch:
        orch.write_suite(
            "quick",
            {
                "a": {"sim_mem_gib": 1, "sim_seconds": 0.2},
                "slow": {"sim_mem_gib": 1, "sim_seconds": 60},
            },
        )
        orch.submit("quick", "1:glue_rte")
        orch.start_daemon()
        wait_until(lambda: orch.job_states().get(1) == "succeeded", 60, "the quick job to succeed")
        wait_until(lambda: orch.job_states().get(2) == "running", 60, "the slow job to run")
        orch.stop_daemon()
        assert tmux_server_running(orch.db)  # the slow worker still runs in it, to be adopted
        orch.run("cancel", "2")  # no daemon: the cancel stops the worker's process group itself
        orch.start_daemon()
        wait_until(lambda: orch.job_states().get(2) == "cancelled", 30, "the cancel to be recorded")
        orch.stop_daemon()
        assert not tmux_server_running(orch.db)



def test_a_piped_demo_prints_each_event_as_it_happens(tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "demo", "--pairs", "1:glue_rte", "--timeout", "240"],
        cwd=tmp_path, env=demo_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert demo.stdout is not None
        seen = []
        for line in demo.stdout:  # blocks until a line comes: the test's own timeout bounds it
            seen.append(line)
            if re.search(r"job \d: attempt 1 started on GPU", line):
                break
        # the first start arrives while the sweep still runs (its jobs take seconds), not with
        # the closing line
        assert demo.poll() is None and not any("demo done" in s for s in seen), seen
        rest = demo.communicate(timeout=240)[0]
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0 and "demo done: 3 succeeded" in rest


def _as_from_a_terminal() -> None:
    """The demo starts as from a shell in a terminal: SIGINT, SIGTERM and SIGHUP at their defaults and
    unblocked, whatever this test process inherited (Python turns SIGINT into KeyboardInterrupt
    only where its parent left SIGINT at the default)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def _signal_masks(pid: int) -> str:
    with contextlib.suppress(OSError):
        return " ".join(line.strip() for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                        if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
    return "(gone)"


def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` and neither ignores nor blocks it."""
    masks = dict(part.split(":") for part in _signal_masks(pid).split(" ") if ":" in part)
    bit = 1 << (signum - 1)
    return bool(int(masks.get("SigCgt", "0"), 16) & bit) and not (int(masks.get("SigIgn", "0"), 16) & bit) \
        and not (int(masks.get("SigBlk", "0"), 16) & bit)


# SIGHUP: the terminal the demo runs in was closed
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_an_interrupted_demo_stops_its_daemon_and_workers(tmp_path: Path, signum: int) -> None:
    # the demo's own plans with jobs of 10 minutes: the sweep cannot end before the signal does
    plans = tmp_path / "plans"
    shutil.copytree(REPO_ROOT / "plans", plans)
    for config in (plans / "configs" / "demo").glob("*.yaml"):
        config.write_text(re.sub(r"(?m)^sim_seconds: .*$", "sim_seconds: 600", config.read_text()))
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        demo = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "demo", "--pairs", "1:glue_rte", "--timeout", "240",
             "--plans", str(plans)],
            cwd=tmp_path, env=demo_env(tmp_path), stdout=out, stderr=err, text=True,
            preexec_fn=_as_from_a_terminal)
    try:
        started = wait_until(
            lambda: re.search(
                r"^\d\d:\d\d:\d\d job \d: attempt 1 started", out_path.read_text(), re.M
            ),
            120,
            "a demo job to start",
        )
        assert started
        match = re.search(r"demo database: (\S+)", out_path.read_text())
        assert match
        db = Path(match.group(1))
        # the start is recorded before the daemon opens the attempt's tmux window: wait for it
        wait_until(lambda: orch_processes_for(db) and tmux_server_running(db), 60, "its daemon and workers to run")
        assert _catches(demo.pid, signum), _signal_masks(demo.pid)  # Python's handler, not ignored or blocked
        demo.send_signal(signum)
        try:
            assert demo.wait(timeout=120) == 130
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the demo ran on after {signum!r}: {_signal_masks(demo.pid)}\n"
                                 f"{err_path.read_text()}\n{out_path.read_text()[-2000:]}") from None
    finally:
        if demo.poll() is None:
            demo.kill()
    said = err_path.read_text()
    assert "demo stopped: nothing of it is left running" in said and "orch: aborted" in said, said
    assert "demo done" not in out_path.read_text()
    assert orch_processes_for(db) == []
    assert not tmux_server_running(db)
