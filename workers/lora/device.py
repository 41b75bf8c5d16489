"""The device a LoRA worker trains on, and the peak memory it reports."""

from __future__ import annotations

import math
import os
import resource
from typing import Any

import torch

MIB = 1024 * 1024


def select_device() -> torch.device:
    wanted = os.environ.get("ORCH_WORKER_DEVICE")
    if wanted:
        return torch.device(wanted)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def reset_peak(device: torch.device) -> None:
    """Start the peak over (a fused group's membership changed); the CPU's peak RSS cannot be."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, Any]:
    """Peak memory: CUDA allocator reservation on a GPU, the process's peak RSS on CPU."""
    if device.type == "cuda":
        return {
            "peak_mem_mib": math.ceil(torch.cuda.max_memory_reserved(device) / MIB),
            "peak_mem_allocated_mib": math.ceil(torch.cuda.max_memory_allocated(device) / MIB),
            "peak_mem_kind": "cuda_max_memory_reserved",
        }
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"peak_mem_mib": math.ceil(rss_kib / 1024), "peak_mem_kind": "cpu_peak_rss"}
