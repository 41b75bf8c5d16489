"""Simulated GPUs: sizes, foreign memory, liveness of holders, and memory attribution."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from orchestrator.errors import GpuUnavailable, UsageError
from orchestrator.gpu import make_probe
from orchestrator.gpu.attribution import process_tree_pids
from orchestrator.gpu.sim import hold_foreign, parse_foreign, parse_gpu_sizes
from orchestrator.gpu.sim_files import FOREIGN_PID, gpu_dir, sim_uuid


@pytest.fixture
def sim_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("ORCH_GPU_BACKEND", "sim")
    monkeypatch.setenv("ORCH_SIM_GPUS", "3x24GiB")
    monkeypatch.setenv("ORCH_SIM_DIR", str(tmp_path / "sim"))
    monkeypatch.delenv("ORCH_SIM_FOREIGN", raising=False)
    return tmp_path / "sim"


def write_holding(state_dir: Path, index: int, pid: int, mib: int, create_time: float) -> Path:
    path = gpu_dir(state_dir, index) / f"{pid}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "used_mib": mib, "create_time": create_time}))
    return path


@pytest.mark.parametrize(
    ("spec", "sizes"),
    [
        ("7x24GiB", [24576] * 7),
        ("24GiB,24GiB,48GiB", [24576, 24576, 49152]),
        ("2x512MiB, 1.5GiB", [512, 512, 1536]),
    ],
)
def test_parse_sizes(spec: str, sizes: list[int]) -> None:
    assert parse_gpu_sizes(spec) == sizes


@pytest.mark.parametrize("spec", ["", "7x", "24GB", "0x24GiB", "abc", "24GiB,,"])
def test_parse_sizes_rejects_bad_values_naming_them(spec: str) -> None:
    with pytest.raises(UsageError, match="ORCH_SIM_GPUS"):
        parse_gpu_sizes(spec)


def test_parse_foreign() -> None:
    assert parse_foreign("1:6GiB,3:20GiB", 4) == {1: 6144, 3: 20480}
    with pytest.raises(UsageError, match="GPU 5"):
        parse_foreign("5:1GiB", 4)
    with pytest.raises(UsageError, match="'1-6GiB'"):
        parse_foreign("1-6GiB", 4)


def test_snapshot_shape(sim_env: Path) -> None:
    snaps = make_probe().snapshot()
    assert [s.index for s in snaps] == [0, 1, 2]
    assert [s.uuid for s in snaps] == [sim_uuid(i) for i in range(3)]
    assert len({s.uuid for s in snaps}) == 3
    assert all(s.total_mib == 24576 and s.free_mib == 24576 and s.used_mib == 0 for s in snaps)


def test_live_holder_counts_and_dead_or_reused_pids_do_not(sim_env: Path) -> None:
    me = psutil.Process()
    write_holding(sim_env, 0, me.pid, 5000, me.create_time())
    # Our own pid with a wrong create_time: a reused pid must not keep memory allocated.
    reused = write_holding(sim_env, 1, me.pid, 7000, me.create_time() - 100)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = write_holding(sim_env, 2, dead.pid, 9000, 0.0)

    gpu0, gpu1, gpu2 = make_probe().snapshot()
    assert (gpu0.used_mib, gpu0.free_mib) == (5000, 24576 - 5000)
    assert gpu0.memory_of(frozenset({me.pid})) == 5000
    assert gpu1.used_mib == 0 and gpu2.used_mib == 0
    assert not reused.exists() and not gone.exists()  # stale files are cleaned up


def test_foreign_memory_from_env_and_helper(sim_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_SIM_FOREIGN", "1:6GiB")
    probe = make_probe()
    held = hold_foreign(sim_env, 2, 1000)
    hold_foreign(sim_env, 2, 500, name="other")
    _, gpu1, gpu2 = probe.snapshot()
    assert gpu1.used_mib == 6144
    assert [(p.pid, p.used_mib) for p in gpu1.processes] == [(FOREIGN_PID, 6144)]
    assert gpu2.used_mib == 1500 and gpu2.processes[0].pid == FOREIGN_PID

    held.unlink()
    assert probe.snapshot()[2].used_mib == 500

    # A later probe without ORCH_SIM_FOREIGN forgets the env's foreign memory.
    monkeypatch.delenv("ORCH_SIM_FOREIGN")
    assert make_probe().snapshot()[1].used_mib == 0


def test_explicit_state_dir_wins(sim_env: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    hold_foreign(other, 0, 100)
    assert make_probe("sim", state_dir=other).snapshot()[0].used_mib == 100
    assert make_probe("sim").snapshot()[0].used_mib == 0


def test_sim_misconfiguration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ORCH_SIM_GPUS", raising=False)
    monkeypatch.delenv("ORCH_SIM_DIR", raising=False)
    with pytest.raises(GpuUnavailable, match="ORCH_SIM_GPUS"):
        make_probe("sim")
    monkeypatch.setenv("ORCH_SIM_GPUS", "2x24GiB")
    with pytest.raises(GpuUnavailable, match="ORCH_SIM_DIR"):
        make_probe("sim")
    with pytest.raises(UsageError, match="unknown GPU backend 'cuda'"):
        make_probe("cuda", state_dir=tmp_path)


def test_process_tree_attribution(sim_env: Path) -> None:
    code = (
        "import subprocess,sys,time; c=subprocess.Popen([sys.executable,'-c','import time; "
        "time.sleep(30)']); print(c.pid, flush=True); time.sleep(30)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert process_tree_pids(parent.pid) == frozenset({parent.pid, child_pid})
        child = psutil.Process(child_pid)
        write_holding(sim_env, 0, child_pid, 3000, child.create_time())
        hold_foreign(sim_env, 0, 2000)
        gpu0 = make_probe().snapshot()[0]
        assert gpu0.used_mib == 5000
        assert gpu0.memory_of(process_tree_pids(parent.pid)) == 3000
        assert gpu0.memory_of(process_tree_pids(os.getpid())) == 3000  # we are the ancestor of both
    finally:
        for proc in psutil.Process(parent.pid).children(recursive=True):
            proc.kill()
        parent.kill()
        parent.wait()
    assert process_tree_pids(parent.pid) == frozenset()
