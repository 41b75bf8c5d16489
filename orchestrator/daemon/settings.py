"""What the daemon is started with (`orch daemon run` options), its pacing constants, and the
facts it reads once at start (the GPU topology)."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

from orchestrator.attempts.disk_space import (
    DEFAULT_MIN_FREE_MIB,
    DEFAULT_WARN_FREE_MIB,
)
from orchestrator.gpu import GpuProbe

log = logging.getLogger(__name__)


MAX_ATTEMPT_ERRORS = 5  # passes in a row that fail on one attempt before it is closed as failed
WAKE_CHECK_S = 0.1  # how often an idle daemon looks for commits by other processes
WRAPPER_EXIT_WAIT_S = 1.0  # a poking wrapper is still exiting: its group is judged once it has


@dataclass(frozen=True)
class DaemonSettings:
    db_path: Path
    poll_s: float = 1.0
    headroom_fraction: float = 0.10
    headroom_max_mib: int | None = 4096
    starvation_s: float = 600.0
    order: str = "longest_first"  # among equal priorities; "fifo" keeps submission order
    notify_urls: tuple[str, ...] = ()  # sent a line when a suite finishes or a job fails
    max_in_queue: int = 16  # a remote executor (Slurm): attempts kept submitted at once
    min_free_mib: int = DEFAULT_MIN_FREE_MIB  # below this on the runs dir's filesystem, jobs wait
    warn_free_mib: int = DEFAULT_WARN_FREE_MIB  # below this, the daemon warns
    host_reserve_mib: int = 2048  # host RAM no job may take (--host-reserve-gib)
    mps: bool = False  # run a CUDA MPS control daemon for our cards (--mps, env ORCH_MPS)
    overlap: bool = False  # start jobs a learned start-up ahead (--overlap, env ORCH_OVERLAP)


@functools.lru_cache(maxsize=4096)
def run_dir_path(run_dir: str) -> Path:
    return Path(run_dir)


def gpu_topology(probe: GpuProbe) -> dict[tuple[int, int], int] | None:
    """Card distances where the probe can tell (NVML, simulated pairs); None elsewhere."""
    read = getattr(probe, "topology", None)
    if read is None:
        return None
    try:
        return dict(read())
    except Exception:  # topology only orders equally good choices: never stop the daemon for it
        log.warning("cannot read the GPU topology", exc_info=True)
        return None
