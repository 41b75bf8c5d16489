"""NVML probe against a faked pynvml: the one boundary CI cannot reach."""

from __future__ import annotations

import builtins
import sys
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from orchestrator.errors import GpuUnavailable
from orchestrator.gpu import make_probe
from orchestrator.gpu.nvml import NVML_VALUE_NOT_AVAILABLE, NvmlProbe

MIB = 1024 * 1024


class FakeNvml:
    """Two GPUs; GPU 1 has a process whose memory NVML cannot report."""

    def __init__(self) -> None:
        self.inits = 0
        self.shutdowns = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in (
            "nvmlInit",
            "nvmlShutdown",
            "nvmlDeviceGetCount",
            "nvmlDeviceGetHandleByIndex",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetName",
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        ):
            monkeypatch.setattr(pynvml, name, getattr(self, name))

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: Any = None) -> Any:
        assert version == pynvml.nvmlMemory_v2
        total = 24 * 1024 * MIB
        free = (20 * 1024 if handle == 0 else 1024) * MIB
        return SimpleNamespace(
            total=total, free=free, used=total - free - 300 * MIB, reserved=300 * MIB
        )

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=37, memory=5)

    def nvmlDeviceGetUUID(self, handle: int) -> str | bytes:
        return f"GPU-aaaa-{handle}" if handle == 0 else b"GPU-bbbb-1"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA GeForce RTX 4090"

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        if handle == 0:
            return [SimpleNamespace(pid=100, usedGpuMemory=3 * 1024 * MIB)]
        return [
            SimpleNamespace(pid=200, usedGpuMemory=NVML_VALUE_NOT_AVAILABLE),
            SimpleNamespace(pid=201, usedGpuMemory=None),
            SimpleNamespace(pid=202, usedGpuMemory=22 * 1024 * MIB),
        ]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Any]:
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        # pid 100 is also a graphics process: counted once, not twice
        return [SimpleNamespace(pid=100, usedGpuMemory=3 * 1024 * MIB)]


def test_snapshot_reads_memory_processes_and_tolerates_na(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    fake.install(monkeypatch)
    probe = NvmlProbe()
    assert fake.inits == 0  # lazy
    gpu0, gpu1 = probe.snapshot()
    probe.snapshot()
    assert fake.inits == 1

    assert (gpu0.index, gpu0.uuid, gpu0.name) == (0, "GPU-aaaa-0", "NVIDIA GeForce RTX 4090")
    assert (gpu0.total_mib, gpu0.free_mib, gpu0.used_mib) == (24576, 20480, 4096)
    assert gpu0.utilization_pct == 37
    assert [(p.pid, p.used_mib) for p in gpu0.processes] == [(100, 3072)]

    assert gpu1.uuid == "GPU-bbbb-1"  # bytes from older bindings are decoded
    assert gpu1.utilization_pct is None
    assert {p.pid: p.used_mib for p in gpu1.processes} == {200: 0, 201: 0, 202: 22528}
    assert gpu1.memory_of(frozenset({202, 999})) == 22528

    probe.close()
    assert fake.shutdowns == 1


def test_v1_memory_info_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    fake.install(monkeypatch)

    def v1_only(handle: int, version: Any = None) -> Any:
        if version is not None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return SimpleNamespace(total=8192 * MIB, free=4096 * MIB, used=4096 * MIB)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", v1_only)
    assert [s.free_mib for s in NvmlProbe().snapshot()] == [4096, 4096]


def test_init_failure_is_gpu_unavailable_with_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    monkeypatch.delenv("ORCH_GPU_BACKEND", raising=False)
    with pytest.raises(GpuUnavailable, match="ORCH_GPU_BACKEND=sim"):
        make_probe()


def test_query_failure_is_gpu_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    fake.install(monkeypatch)

    def lost(handle: int) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lost)
    with pytest.raises(GpuUnavailable, match="NVML query failed"):
        NvmlProbe().snapshot()


def test_missing_bindings_is_gpu_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_pynvml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "pynvml")
    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    with pytest.raises(GpuUnavailable, match="nvidia-ml-py"):
        make_probe("nvml")
