"""The simulated-GPU file protocol, shared by orchestrator.gpu.sim (the daemon's view) and
workers.sim (the worker that allocates): card sizes, uuids, one directory and lock per card, and
holder files {pid, used_mib, create_time}. Standard library only: the sim worker imports it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from orchestrator.procstat import process_matches

SIZE_RE = re.compile(r"^\s*(?:(\d+)\s*x\s*)?(\d+(?:\.\d+)?)\s*(GiB|MiB|G|M)\s*$", re.IGNORECASE)
FOREIGN_PID = 0  # pid shown for memory held by processes orch did not start
LOCK_FILE = ".lock"
HOST_DIR = "host"  # $ORCH_SIM_DIR/host: simulated host RAM, same holder files as a GPU


def parse_sizes_mib(spec: str) -> list[int]:
    """'7x24GiB' or '24GiB,24GiB,48GiB' (also MiB, and mixed '2x24GiB,48GiB') -> sizes in MiB."""
    sizes: list[int] = []
    for item in spec.split(","):
        match = SIZE_RE.match(item)
        if not match:
            raise ValueError(
                f"invalid ORCH_SIM_GPUS entry {item.strip()!r} in {spec!r}: "
                "expected e.g. '7x24GiB' or '24GiB,24GiB,48GiB' (units GiB or MiB)"
            )
        count = int(match.group(1) or 1)
        unit_mib = 1024 if match.group(3).lower().startswith("g") else 1
        size_mib = int(float(match.group(2)) * unit_mib)
        if count < 1 or size_mib < 1:
            raise ValueError(f"invalid ORCH_SIM_GPUS entry {item.strip()!r}: sizes must be > 0")
        sizes.extend([size_mib] * count)
    return sizes


def sim_uuid(index: int) -> str:
    """Stable uuid of simulated GPU `index`, shaped like NVML's."""
    return f"GPU-00000000-sim0-0000-0000-{index:012d}"


def gpu_dir(state_dir: Path, index: int) -> Path:
    return Path(state_dir) / f"gpu{index}"


@contextlib.contextmanager
def gpu_lock(directory: Path) -> Iterator[None]:
    """Exclusive lock on one simulated GPU: allocation checks and stale-file removal take it."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / LOCK_FILE, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def holder_alive(pid: int, create_time: float) -> bool:
    """True when `pid` runs and is the process that wrote the file (not a reuse of its pid)."""
    return process_matches(pid, create_time)  # one /proc read: asked for every holder, every second


def read_holders(directory: Path) -> tuple[list[tuple[int, int]], list[Path]]:
    """Live holdings [(pid, used_mib)] of one GPU dir (foreign ones as pid 0), and stale files."""
    holders: list[tuple[int, int]] = []
    stale: list[Path] = []
    base = os.fspath(directory)
    try:  # read every second by the daemon and each wrapper's sampler: no Path per file
        names = sorted(entry.name for entry in os.scandir(base) if entry.name.endswith(".json"))
    except OSError:
        return holders, stale  # no such GPU dir (yet)
    for name in names:
        try:
            with open(os.path.join(base, name), encoding="utf-8") as handle:
                record = json.loads(handle.read())
            used_mib = int(record["used_mib"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # vanished between listing and read, or unreadable: not a holding
        if name.startswith("foreign-"):
            holders.append((FOREIGN_PID, used_mib))
        elif holder_alive(int(record.get("pid", -1)), float(record.get("create_time", -1))):
            holders.append((int(record["pid"]), used_mib))
        else:
            stale.append(directory / name)
    return holders, stale
