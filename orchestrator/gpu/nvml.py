"""NVML probe: the one module that talks to the NVIDIA driver (through nvidia-ml-py's `pynvml`).

NVML is initialised lazily on the first snapshot; every NVMLError (and a missing library) is
turned into GpuUnavailable with a message saying what to do.
"""

from __future__ import annotations

import contextlib
import threading
from types import ModuleType
from typing import Any

from orchestrator.errors import GpuUnavailable
from orchestrator.gpu.snapshot import GpuSnapshot, ProcessMemory

MIB = 1024 * 1024
# NVML reports "not available" for per-process memory as all bits set (or None in newer bindings).
NVML_VALUE_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF
HINT = "no NVIDIA GPU is usable here; to run without one set ORCH_GPU_BACKEND=sim (and ORCH_SIM_GPUS=7x24GiB)"


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:
        raise GpuUnavailable(f"nvidia-ml-py (pynvml) is not installed ({exc}); {HINT}") from None
    return pynvml


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _process_mib(used_bytes: Any) -> int | None:
    if used_bytes is None or used_bytes == NVML_VALUE_NOT_AVAILABLE or used_bytes < 0:
        return None
    return int(used_bytes) // MIB


class NvmlProbe:
    """GpuProbe over the NVIDIA driver. Snapshots are ordered by NVML index."""

    def __init__(self) -> None:
        self._nvml: ModuleType | None = None
        self._lock = threading.Lock()
        self._sm_seen_us: dict[int, int] = {}  # card index -> the newest utilisation sample read

    def _init(self) -> ModuleType:
        with self._lock:
            if self._nvml is None:
                nvml = _import_pynvml()
                try:
                    nvml.nvmlInit()
                except nvml.NVMLError as exc:
                    raise GpuUnavailable(f"NVML could not initialise: {exc}; {HINT}") from None
                self._nvml = nvml
            return self._nvml

    def snapshot(self) -> tuple[GpuSnapshot, ...]:
        nvml = self._init()
        try:
            count = nvml.nvmlDeviceGetCount()
            return tuple(self._read(nvml, index) for index in range(count))
        except nvml.NVMLError as exc:
            raise GpuUnavailable(
                f"NVML query failed: {exc}; check `nvidia-smi` works, or set ORCH_GPU_BACKEND=sim"
            ) from None

    def _read(self, nvml: ModuleType, index: int) -> GpuSnapshot:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            # v2 separates driver-reserved memory from `used`; free is what packing needs.
            memory = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        except (nvml.NVMLError, AttributeError, TypeError):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            utilization_pct: int | None = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError:
            utilization_pct = None  # not supported on some cards (and MIG)
        total_mib = int(memory.total) // MIB
        free_mib = int(memory.free) // MIB
        return GpuSnapshot(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            total_mib=total_mib,
            used_mib=total_mib - free_mib,
            free_mib=free_mib,
            utilization_pct=utilization_pct,
            processes=self._processes(nvml, handle, self._process_sm(nvml, handle, index)),
        )

    def _process_sm(self, nvml: ModuleType, handle: Any, index: int) -> dict[int, int] | None:
        """Each process's share of the card's SMs since the last reading (its latest sample;
        0 for a process with none: it ran no kernel since), or None where NVML has no
        per-process figures (older cards, MIG, vGPU)."""
        since_us = self._sm_seen_us.get(index, 0)
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, since_us)
        except nvml.NVMLError as exc:
            not_found = getattr(nvml, "NVML_ERROR_NOT_FOUND", None)
            no_samples = not_found is not None and getattr(exc, "value", None) == not_found
            return {} if no_samples else None
        except Exception:  # bindings without the call, or a driver that answers oddly: no figures
            return None
        latest: dict[int, tuple[int, int]] = {}
        for sample in samples or ():
            stamp, pid, sm = int(sample.timeStamp), int(sample.pid), int(sample.smUtil)
            if stamp >= latest.get(pid, (-1, 0))[0] and 0 <= sm <= 100:
                latest[pid] = (stamp, sm)
        if latest:
            self._sm_seen_us[index] = max(stamp for stamp, _ in latest.values())
        return {pid: sm for pid, (_, sm) in latest.items()}

    @staticmethod
    def _processes(nvml: ModuleType, handle: Any,
                   sm_by_pid: dict[int, int] | None = None) -> tuple[ProcessMemory, ...]:
        per_pid: dict[int, int] = {}
        for query in (
            nvml.nvmlDeviceGetComputeRunningProcesses,
            nvml.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            try:
                infos = query(handle)
            except nvml.NVMLError:
                continue  # e.g. NotSupported for graphics processes on data-centre cards
            for info in infos:
                mib = _process_mib(getattr(info, "usedGpuMemory", None))
                # A process may be both compute and graphics: keep the larger reading, not the sum.
                per_pid[int(info.pid)] = max(per_pid.get(int(info.pid), 0), mib or 0)
        return tuple(ProcessMemory(pid, mib, None if sm_by_pid is None else sm_by_pid.get(pid, 0))
                     for pid, mib in sorted(per_pid.items()))

    def topology(self) -> dict[tuple[int, int], int]:
        """Pairwise distance of the cards by NVML's common ancestor (10: same board or switch,
        20: several switches, 30: host bridge, 40: NUMA node, 50: across sockets); NVLink-
        connected pairs count as 0. Pairs NVML cannot place are left out (distance 0)."""
        nvml = self._init()
        distances: dict[tuple[int, int], int] = {}
        try:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except nvml.NVMLError:
            return distances
        for i, a in enumerate(handles):
            for j in range(i + 1, len(handles)):
                try:
                    level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(a, handles[j]))
                except (nvml.NVMLError, AttributeError):
                    continue
                try:
                    linked = nvml.nvmlDeviceGetP2PStatus(a, handles[j], nvml.NVML_P2P_CAPS_INDEX_NVLINK) == 0
                except (nvml.NVMLError, AttributeError):
                    linked = False
                distances[(i, j)] = 0 if linked else level
        return distances

    def close(self) -> None:
        with self._lock:
            if self._nvml is not None:
                # shutting down a half-dead driver is not worth an error
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlShutdown()
                self._nvml = None


def nvml_available() -> bool:
    """True when NVML initialises and reports at least one device."""
    probe = NvmlProbe()
    try:
        return len(probe.snapshot()) > 0
    except GpuUnavailable:
        return False
    finally:
        probe.close()


def driver_versions() -> dict[str, str]:
    """The NVIDIA driver's version and the CUDA version it supports (`12.4`); {} without NVML."""
    try:
        nvml = _import_pynvml()
        nvml.nvmlInit()
    except Exception:  # no library, no driver: nothing to say
        return {}
    found: dict[str, str] = {}
    try:
        with contextlib.suppress(Exception):
            found["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
        with contextlib.suppress(Exception):
            version = int(nvml.nvmlSystemGetCudaDriverVersion())
            found["cuda"] = f"{version // 1000}.{version % 1000 // 10}"
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return found
