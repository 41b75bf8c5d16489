"""The wrapper's own GPU peak: its process tree's memory, sampled on the node where it runs.

Written to `gpu_peak.json` in the run dir (atomically, whenever the peak grows), so memory
learning works on every executor, also where the daemon cannot read this node's GPUs (Slurm).
NVML where present, the simulated GPUs where ORCH_GPU_BACKEND=sim; nothing where neither is.
Read back as untrusted input: a regular file of bounded size holding one sane integer.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
from pathlib import Path

from orchestrator.rundir_files import RunDir, write_json

SAMPLE_S = 1.0
MAX_FILE_BYTES = 4096
MAX_PEAK_MIB = 16 * 1024 * 1024  # 16 TiB: anything larger is not a reading


class GpuPeakSampler:
    def __init__(self, run_dir: Path, root_pid: int, interval_s: float = SAMPLE_S) -> None:
        self.run_dir = run_dir
        self.root_pid = root_pid
        self.interval_s = interval_s
        self.peak_mib = 0
        self.samples = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gpu-peak", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(self.interval_s * 3)

    def _run(self) -> None:
        from orchestrator.gpu import make_probe
        from orchestrator.gpu.attribution import process_tree_pids

        try:
            probe = make_probe(None)
        except Exception:  # no NVML and no simulated GPUs here: nothing to measure
            return
        try:
            while True:
                pids = process_tree_pids(self.root_pid)
                if pids:
                    with contextlib.suppress(Exception):
                        held = sum(s.memory_of(pids) for s in probe.snapshot())
                        self.samples += 1
                        if held > self.peak_mib:
                            self.peak_mib = held
                            self._write()
                if self._stop.wait(self.interval_s):
                    return
        finally:
            with contextlib.suppress(Exception):
                probe.close()

    def _write(self) -> None:
        with contextlib.suppress(OSError):
            write_json(RunDir(self.run_dir).gpu_peak, {"peak_mib": self.peak_mib, "samples": self.samples})


def read_gpu_peak_mib(run_dir: Path) -> int:
    """The wrapper's measured peak, or 0 when absent or not believable."""
    path = RunDir(run_dir).gpu_peak
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return 0
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
            return 0
        data = json.loads(os.read(fd, MAX_FILE_BYTES).decode("utf-8"))
    except (OSError, ValueError):
        return 0
    finally:
        os.close(fd)
    peak = data.get("peak_mib") if isinstance(data, dict) else None
    if isinstance(peak, bool) or not isinstance(peak, int) or not 0 <= peak <= MAX_PEAK_MIB:
        return 0
    return peak
