"""Simulated GPUs: cards whose memory is really held by `workers.sim` processes.

The file protocol (one directory per GPU, one holding file per process) lives in `workers.sim`,
so the worker and this probe cannot disagree about it. Memory of processes orch did not start
("foreign") is shown as one process with pid 0 per GPU: pid 0 is never part of an attempt's
process tree, so it always counts against the GPU and never against one of our jobs.

Foreign memory comes from `ORCH_SIM_FOREIGN="1:6GiB,3:20GiB"` (written by the probe into
`gpu<i>/foreign-env.json` so workers see it too) and from `hold_foreign()` in tests.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from orchestrator.errors import GpuUnavailable, UsageError
from orchestrator.gpu.sim_files import (
    FOREIGN_PID,
    gpu_dir,
    gpu_lock,
    parse_sizes_mib,
    read_holders,
    sim_uuid,
)
from orchestrator.gpu.snapshot import GpuSnapshot, ProcessMemory
from orchestrator.rundir_files import write_json

ENV_FOREIGN_NAME = "env"


def parse_gpu_sizes(spec: str) -> list[int]:
    """ORCH_SIM_GPUS -> card sizes in MiB; a malformed value is a UsageError naming it."""
    try:
        return parse_sizes_mib(spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def parse_foreign(spec: str, gpu_count: int) -> dict[int, int]:
    """ORCH_SIM_FOREIGN "1:6GiB,3:20GiB" -> {gpu index: MiB}."""
    foreign: dict[int, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        index_text, _, size_text = item.partition(":")
        try:
            index = int(index_text)
            (size_mib,) = parse_sizes_mib(size_text)
        except ValueError:
            raise UsageError(
                f"invalid ORCH_SIM_FOREIGN entry {item!r}: expected INDEX:SIZE, e.g. '1:6GiB'"
            ) from None
        if not 0 <= index < gpu_count:
            raise UsageError(
                f"ORCH_SIM_FOREIGN names GPU {index}, but ORCH_SIM_GPUS has {gpu_count}"
            )
        foreign[index] = foreign.get(index, 0) + size_mib
    return foreign


def hold_foreign(state_dir: Path, gpu_index: int, mib: int, *, name: str = "test") -> Path:
    """Mark `mib` of GPU `gpu_index` as held by a foreign process; delete the file to free it."""
    path = gpu_dir(state_dir, gpu_index) / f"foreign-{name}.json"
    write_json(path, {"pid": FOREIGN_PID, "used_mib": int(mib), "create_time": 0}, parents=True)
    return path


class SimProbe:
    """GpuProbe over simulated GPUs in `state_dir`."""

    def __init__(self, state_dir: Path, sizes_mib: list[int], foreign_mib: dict[int, int]) -> None:
        self.state_dir = Path(state_dir)
        self.sizes_mib = list(sizes_mib)
        for index in range(len(self.sizes_mib)):
            gpu_dir(self.state_dir, index).mkdir(parents=True, exist_ok=True)
            env_file = gpu_dir(self.state_dir, index) / f"foreign-{ENV_FOREIGN_NAME}.json"
            if foreign_mib.get(index):
                hold_foreign(self.state_dir, index, foreign_mib[index], name=ENV_FOREIGN_NAME)
            else:
                with contextlib.suppress(FileNotFoundError):
                    env_file.unlink()  # left over from an earlier ORCH_SIM_FOREIGN

    def snapshot(self) -> tuple[GpuSnapshot, ...]:
        return tuple(self._read(index, total) for index, total in enumerate(self.sizes_mib))

    def _read(self, index: int, total_mib: int) -> GpuSnapshot:
        directory = gpu_dir(self.state_dir, index)
        holders, stale = read_holders(directory)
        if stale:
            self._remove_stale(directory)
        per_pid: dict[int, int] = {}
        for pid, mib in holders:
            per_pid[pid] = per_pid.get(pid, 0) + mib
        used_mib = min(total_mib, sum(per_pid.values()))
        return GpuSnapshot(
            index=index,
            uuid=sim_uuid(index),
            name=f"Simulated GPU {total_mib // 1024} GiB",
            total_mib=total_mib,
            used_mib=used_mib,
            free_mib=total_mib - used_mib,
            utilization_pct=None,
            processes=tuple(ProcessMemory(pid, mib) for pid, mib in sorted(per_pid.items())),
        )

    @staticmethod
    def _remove_stale(directory: Path) -> None:
        # Re-read under the lock: a new process may have reused the pid and written its file.
        with gpu_lock(directory):
            _, stale = read_holders(directory)
            for path in stale:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    def topology(self) -> dict[tuple[int, int], int]:
        from orchestrator.gpu.host import sim_topology

        return sim_topology(len(self.sizes_mib))

    def close(self) -> None:
        """Nothing to release: the probe holds no handles between snapshots."""


def make_sim_probe(state_dir: Path | None = None) -> SimProbe:
    """A SimProbe configured from ORCH_SIM_GPUS, ORCH_SIM_FOREIGN and ORCH_SIM_DIR."""
    spec = os.environ.get("ORCH_SIM_GPUS", "")
    if not spec.strip():
        raise GpuUnavailable("ORCH_GPU_BACKEND=sim needs ORCH_SIM_GPUS, e.g. ORCH_SIM_GPUS=7x24GiB")
    sizes_mib = parse_gpu_sizes(spec)
    directory = state_dir or (
        Path(os.environ["ORCH_SIM_DIR"]) if os.environ.get("ORCH_SIM_DIR") else None
    )
    if directory is None:
        raise GpuUnavailable(
            "simulated GPUs need a state directory: set ORCH_SIM_DIR to a writable directory"
        )
    foreign_mib = parse_foreign(os.environ.get("ORCH_SIM_FOREIGN", ""), len(sizes_mib))
    try:
        return SimProbe(directory, sizes_mib, foreign_mib)
    except OSError as exc:
        raise GpuUnavailable(f"cannot use simulated GPU directory {directory}: {exc}") from None
