"""What a live attempt's process tree takes beyond its first GPU: memory on each card of a
multi-GPU job (per rank), host RAM (RSS of the tree, DataLoader workers included) and CPU."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import psutil

from orchestrator.gpu.host import HostProbe
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.resources import attempt_uuids


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        total += times.user + times.system
    return total


def _peaks(attempt: Mapping[str, Any]) -> dict[str, int]:
    try:
        loaded = json.loads(attempt.get("peak_by_gpu_json") or "{}")
    except ValueError:
        return {}
    return {str(k): int(v) for k, v in loaded.items() if isinstance(v, int)} if isinstance(loaded, dict) else {}


def _ranks(attempt: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    try:
        loaded = json.loads(attempt.get("peak_by_rank_json") or "{}")
    except ValueError:
        return {}
    return {str(k): v for k, v in loaded.items() if isinstance(v, dict)} if isinstance(loaded, dict) else {}


class ResourceTracker:
    """Per-attempt readings between passes (CPU needs two readings to give a rate)."""

    def __init__(self, host: HostProbe | None) -> None:
        self.host = host
        self._cpu: dict[int, tuple[float, float]] = {}  # attempt id -> (cpu seconds, monotonic time)

    def fields(self, attempt: Mapping[str, Any], pids: list[int], by_uuid: Mapping[str, GpuSnapshot]) -> dict[str, Any]:
        """Column updates for the attempt: per-card memory of a gang (its held/peak become the
        largest rank's), host RAM now and at its peak, CPU cores at their peak."""
        fields: dict[str, Any] = {}
        uuids = attempt_uuids(attempt)
        if len(uuids) > 1:
            per_card = {u: by_uuid[u].memory_of(set(pids)) for u in uuids if u in by_uuid}
            dumped = json.dumps(per_card, sort_keys=True)
            if dumped != attempt.get("held_by_gpu_json"):
                fields["held_by_gpu_json"] = dumped
            peaks = {u: max(v, _peaks(attempt).get(u, 0)) for u, v in per_card.items()}
            if peaks != _peaks(attempt):
                fields["peak_by_gpu_json"] = json.dumps(peaks, sort_keys=True)
            rank_mib = max(per_card.values(), default=0)
            fields["held_mib"] = rank_mib
            if rank_mib > int(attempt["peak_mib"] or 0):
                fields["peak_mib"] = rank_mib
        ranks = _ranks(attempt)
        for uuid in uuids:
            card = by_uuid.get(uuid)
            for process in card.processes if card is not None else ():
                if process.pid in pids and process.used_mib > ranks.get(str(process.pid), {}).get("mib", 0):
                    ranks[str(process.pid)] = {"gpu": uuid, "mib": process.used_mib}
        if ranks != _ranks(attempt):
            fields["peak_by_rank_json"] = json.dumps(ranks, sort_keys=True)
        if self.host is not None:
            host_mib = self.host.tree_mib(pids)
            if host_mib != attempt.get("host_held_mib"):
                fields["host_held_mib"] = host_mib
            if host_mib > int(attempt.get("host_peak_mib") or 0):
                fields["host_peak_mib"] = host_mib
        now = time.monotonic()
        used_s = cpu_seconds(pids)
        previous = self._cpu.get(int(attempt["id"]))
        self._cpu[int(attempt["id"])] = (used_s, now)
        if previous is not None and now > previous[1]:
            cores = round(max(0.0, used_s - previous[0]) / (now - previous[1]), 2)
            if cores > float(attempt.get("cpu_peak_cores") or 0.0):
                fields["cpu_peak_cores"] = cores
        return fields

    def forget(self, attempt_id: int) -> None:
        self._cpu.pop(attempt_id, None)
