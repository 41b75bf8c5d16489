"""The wrapper's own GPU peak: its process tree's memory, sampled on the node where it runs.

Written to `gpu_peak.json` in the run dir by `record` (the wrapper's held run dir, atomically,
whenever the peak grows), with the model and size of the card it peaked on (a mixed cluster's
cards differ), so memory learning works on every executor, also where the daemon cannot read
this node's GPUs (Slurm).
NVML where present, the simulated GPUs where ORCH_GPU_BACKEND=sim; nothing where neither is.
Read back as untrusted input by `attempts.rundir_reads.read_gpu_peak_mib`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

SAMPLE_S = 1.0


class GpuPeakSampler:
    """Samples every `interval_s`, the first one `interval_s` in: a worker holds no GPU memory
    before CUDA has started (seconds), and what the sampler imports first (`prepare`, then NVML)
    then stays off the cores while the other attempts of a batch start."""

    def __init__(self, record: Callable[[dict[str, object]], object], root_pid: int, interval_s: float = SAMPLE_S,
                 prepare: Callable[[], None] | None = None) -> None:
        self.record = record  # writes gpu_peak.json (the wrapper's held run dir)
        self.root_pid = root_pid
        self.interval_s = interval_s
        self.prepare = prepare
        self.peak_mib = 0
        self.samples = 0
        self.gpu_name: str | None = None
        self.gpu_total_mib: int | None = None
        self._stop = threading.Event()
        self._final = False
        self.thread = threading.Thread(target=self._run, name="gpu-peak", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, final: bool = False) -> None:
        """Stop sampling; with `final`, after one last sample (processes the worker left
        behind still hold memory then), even before the first interval is over."""
        self._final = final
        self._stop.set()
        self.thread.join(self.interval_s * 3)

    def _run(self) -> None:
        if self._stop.wait(self.interval_s) and not self._final:
            return
        if self.prepare is not None:
            self.prepare()
        from orchestrator.gpu import make_probe
        from orchestrator.gpu.attribution import TreeMembers

        try:
            probe = make_probe(None)
        except Exception:  # no NVML and no simulated GPUs here: nothing to measure
            return
        tree = TreeMembers(self.root_pid)
        try:
            while True:
                with contextlib.suppress(Exception):
                    snapshots = probe.snapshot()
                    reported = [p.pid for s in snapshots for p in s.processes]
                    tree.forget_except(reported)
                    ours = tree.among(reported)
                    held = sum(s.memory_of(ours) for s in snapshots)
                    self.samples += 1
                    if held > self.peak_mib:
                        self.peak_mib = held
                        # the card it peaked on: on a mixed cluster, a peak means little without its size
                        card = max(snapshots, key=lambda s: s.memory_of(ours))
                        self.gpu_name, self.gpu_total_mib = card.name, card.total_mib
                        self._write()
                if self._stop.is_set() or (self._stop.wait(self.interval_s) and not self._final):
                    return
        finally:
            with contextlib.suppress(Exception):
                probe.close()

    def _write(self) -> None:
        self.record({"peak_mib": self.peak_mib, "samples": self.samples,
                     "gpu_name": self.gpu_name, "gpu_total_mib": self.gpu_total_mib})
