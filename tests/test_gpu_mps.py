"""CUDA MPS on a real GPU: orch's own control daemon, a client fenced at its prediction, and
`orch daemon run --mps` pointing a worker at it. Skipped without NVML, torch CUDA or the binary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.gpu.mps import MpsControl, client_env, control_binary, mps_dirs
from orchestrator.gpu.nvml import nvml_available

REPO_ROOT = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not nvml_available(), reason="no NVIDIA GPU visible to NVML"),
    pytest.mark.skipif(control_binary() is None, reason="nvidia-cuda-mps-control is not on PATH"),
]

ALLOC = (
    "import sys, torch\n"
    "def take(mib):\n"
    "    try:\n"
    "        return torch.empty(mib << 20, dtype=torch.uint8, device='cuda')\n"
    "    except torch.OutOfMemoryError:\n"
    "        return None\n"
    "small = take(256)\n"
    "big = take(4096)\n"
    "print('small', small is not None, 'big', big is not None, flush=True)\n"
)


def test_control_daemon_fences_a_client_and_stops(tmp_path: Path) -> None:
    """A client fenced at 1 GiB + margin gets 256 MiB and is refused 4 GiB; the server lists it;
    `stop` ends the control daemon."""
    control = MpsControl(mps_dirs(tmp_path / "state.db"), ())
    control.start()
    try:
        assert control.alive() and control.answers()
        env = {**os.environ, **client_env(control.dirs, 1024, measured=True)}
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1536M"
        done = subprocess.run([sys.executable, "-c", ALLOC], env=env, capture_output=True, text=True, timeout=120,
                              check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert "small True big False" in done.stdout, done.stdout + done.stderr[-2000:]
        assert control.ask("get_server_list").strip(), "no MPS server was started for the client"
    finally:
        control.stop()
    deadline = time.monotonic() + 15
    while control.alive() and time.monotonic() < deadline:
        time.sleep(0.1)  # the control daemon exits after `quit`
    assert not control.alive()


def test_daemon_with_mps_points_a_worker_at_its_server(tmp_path: Path) -> None:
    """`orch daemon run --mps`: a one-GPU job's worker sees orch's pipe folder, and no fence (its
    shape was never measured: only the declared 2 GiB is known), and the control daemon is gone
    once the daemon stops."""
    plans = tmp_path / "plans"
    (plans / "suites").mkdir(parents=True)
    (plans / "configs" / "m").mkdir(parents=True)
    (plans / "configs" / "m" / "c.yaml").write_text("x: 1\n")
    script = tmp_path / "show_env.py"
    script.write_text(
        "import json, os, torch\n"
        "torch.ones(1, device='cuda').sum().item()\n"
        "print(json.dumps({k: os.environ.get(k) for k in ('CUDA_MPS_PIPE_DIRECTORY', "
        "'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')}))\n"
    )
    (plans / "suites" / "m.yaml").write_text(
        f"worker: {sys.executable} {script}\nmem_gib: 2\nconfigs: [c]\n"
        f"env: {{PYTHONPATH: {json.dumps(os.environ.get('PYTHONPATH', ''))}}}\n"
    )
    db = tmp_path / "state.db"
    env = {**os.environ, "ORCH_DB": str(db), "ORCH_PLANS": str(plans)}
    cli = [sys.executable, "-m", "orchestrator"]
    subprocess.run([*cli, "submit", "--suite", "m", "--pairs", "1:x"], env=env, check=True, cwd=REPO_ROOT,
                   capture_output=True)  # fmt: skip
    daemon = subprocess.Popen([*cli, "daemon", "run", "--mps", "--backend", "nvml", "--launcher", "subprocess",
                               "--poll", "0.3"], env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        state = ""
        while time.monotonic() < deadline:
            jobs = json.loads(subprocess.run([*cli, "jobs", "--json"], env=env, capture_output=True, text=True,
                                             check=True, cwd=REPO_ROOT).stdout or "[]")  # fmt: skip
            state = jobs[0]["state"] if jobs else ""
            if state in ("succeeded", "failed"):
                break
            time.sleep(0.5)  # polling the job's state
        assert state == "succeeded"
        log = next(db.parent.glob("runs/**/attempt-1/stdout.log")).read_text()
        seen = json.loads([line for line in log.splitlines() if line.startswith("{")][-1])
        assert seen["CUDA_MPS_PIPE_DIRECTORY"] == str(mps_dirs(db).pipe)
        assert seen["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] is None
    finally:
        subprocess.run([*cli, "daemon", "stop", "--timeout", "30"], env=env, cwd=REPO_ROOT, capture_output=True,
                       check=False)  # fmt: skip
        daemon.wait(60)
    assert not MpsControl(mps_dirs(db), ()).answers(), "the MPS control daemon outlived orch's daemon"
