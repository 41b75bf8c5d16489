"""A simulated footprint: on simulated GPUs, a worker that is not orch's simulator (a user's own
script, which allocates nothing there) holds the memory orch expects of it, so that packing,
peaks and memory learning on a laptop are those a GPU box would show.

The launch wrapper holds it for the worker's process, on each card CUDA_VISIBLE_DEVICES names,
from the worker's start to its end: the suite's `mem_gib`. orch measures it as the worker's
peak and learns it as it would a real one, so the first job of a shape runs alone while it is
measured and the next ones stack by what was learned. (Not the attempt's prediction: that
carries a margin over the last peak, and a footprint that followed it would grow with every
generation of jobs.) Standard library only: the wrapper runs under `python -S`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from orchestrator.gpu.sim_files import gpu_dir, parse_sizes_mib, sim_uuid

FOOTPRINT_VAR = "ORCH_SIM_FOOTPRINT_MIB"  # set by the launch for workers that hold none themselves
PREFIX = "footprint-"
SIM_WORKER = "sim"  # the suite's `worker: sim`: orch's simulator allocates on the cards itself


def footprint_cards(visible: str, card_count: int) -> list[int]:
    """The simulated cards CUDA_VISIBLE_DEVICES names (uuids or indices), in its order."""
    cards: list[int] = []
    for item in (part.strip() for part in visible.split(",")):
        if item.isdigit() and int(item) < card_count:
            cards.append(int(item))
        else:
            cards.extend(i for i in range(card_count) if item == sim_uuid(i))
    return cards


def footprint_env(worker_env: Mapping[str, str], worker: str, declared_mib: int) -> dict[str, str]:
    """What the launch adds to an attempt's env: its footprint on simulated GPUs, for any worker
    but orch's simulator (which holds its own); nothing on real GPUs."""
    if footprint_mib({**worker_env, FOOTPRINT_VAR: "1"}) == 0 or worker.strip() == SIM_WORKER:
        return {}
    return {FOOTPRINT_VAR: str(max(0, int(declared_mib)))}


def footprint_mib(env: Mapping[str, str]) -> int:
    """The footprint asked for in `env`; 0 (none) off simulated GPUs or when unset or bad."""
    if env.get("ORCH_GPU_BACKEND", "").strip().lower() != "sim":
        return 0
    try:
        return max(0, int(env.get(FOOTPRINT_VAR, "0")))
    except ValueError:
        return 0


class SimFootprint:
    """Holder files for one process on its simulated cards: made by `hold`, removed by
    `release` (and, should the wrapper die first, by the probe, once the process is gone)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.mib = footprint_mib(env)
        self.paths: list[Path] = []
        self.cards: list[int] = []
        state_dir, sizes = env.get("ORCH_SIM_DIR", ""), env.get("ORCH_SIM_GPUS", "")
        if self.mib and state_dir and sizes:
            try:
                count = len(parse_sizes_mib(sizes))
            except ValueError:
                return
            self.cards = footprint_cards(env.get("CUDA_VISIBLE_DEVICES", ""), count)
            self.state_dir = Path(state_dir)

    def hold(self, pid: int, create_time: float) -> None:
        """Hold the footprint for `pid` (the worker) on each of its cards."""
        for index in self.cards:
            path = gpu_dir(self.state_dir, index) / f"{PREFIX}{pid}.json"
            temporary = path.with_name(f".{path.name}.tmp")
            with contextlib.suppress(OSError):
                path.parent.mkdir(parents=True, exist_ok=True)
                record = f'{{"pid": {pid}, "used_mib": {self.mib}, "create_time": {create_time!r}}}'
                temporary.write_text(record, encoding="utf-8")
                os.replace(temporary, path)  # read whole or not at all by the probe
                self.paths.append(path)

    def release(self) -> None:
        for path in self.paths:
            with contextlib.suppress(OSError):
                path.unlink()
        self.paths = []
