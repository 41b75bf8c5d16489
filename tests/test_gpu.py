"""Tests that need a real NVIDIA GPU: skipped wherever NVML sees none (CI, laptops)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.gpu.nvml import NvmlProbe, nvml_available

REPO_ROOT = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not nvml_available(), reason="no NVIDIA GPU visible to NVML"),
]


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def test_nvml_probe_sees_a_process_that_holds_memory() -> None:
    """A child holding 1 GiB shows up in the snapshot's per-process memory, under its pid."""
    if not _torch_cuda():
        pytest.skip("torch without CUDA")
    code = (
        "import sys, torch; x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); "
        "print('ready', flush=True); sys.stdin.readline()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    probe = NvmlProbe()
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        snapshots = probe.snapshot()
        assert snapshots and all(
            s.total_mib > 0 and 0 <= s.used_mib <= s.total_mib for s in snapshots
        )
        assert all(s.used_mib + s.free_mib <= s.total_mib for s in snapshots)
        held = sum(s.memory_of({child.pid}) for s in snapshots)
        assert held >= 1024, f"NVML shows {held} MiB for pid {child.pid}: {snapshots}"
    finally:
        probe.close()
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.close()
        child.wait(30)


def test_tiny_llama_lora_job_runs_on_cuda(tmp_path: Path) -> None:
    """The LoRA worker trains on the GPU and reports the allocator's peak in result.json."""
    if not _torch_cuda():
        pytest.skip("torch without CUDA")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop("ORCH_WORKER_DEVICE", None)
    subprocess.run([sys.executable, "-m", "workers.lora.sample_data", "--out", str(tmp_path / "data"),
                    "--tasks", "rte", "--n-train", "64", "--n-dev", "16"],
                   check=True, env=env, capture_output=True)  # fmt: skip
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(
        f"model: tiny-llama\ndata: glue-tvt_rte\ndata_dir: {tmp_path / 'data'}\n"
        "batch_size: 8\nmax_steps: 4\nprec: bf16\nno_save: true\n"
    )
    done = subprocess.run([sys.executable, "-m", "workers.lora", "--run-dir", str(run_dir)],
                          env=env, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "device cuda" in done.stderr
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "succeeded" and result["steps"] == 4
    assert result["peak_mem_kind"] == "cuda_max_memory_reserved"
    assert result["peak_mem_mib"] >= result["peak_mem_allocated_mib"] > 0
