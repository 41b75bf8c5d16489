"""What a live attempt's process tree takes beyond its first GPU: memory on each card of a
multi-GPU job (per rank), host RAM (RSS of the tree, DataLoader workers included) and CPU.

GPU memory is read at every pass. Host RAM and CPU cost /proc reads per process of the tree, so
they are read at every pass only while the attempt ramps up (its first HOST_WARMUP_S as seen by
this daemon, or until it reaches its peak), then every HOST_SAMPLE_S: its CPU cores are then the
average over that interval."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import psutil

from orchestrator import procstat
from orchestrator.gpu.host import HostProbe
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.procstat import HAVE_PROC, read_stat
from orchestrator.store.rows import Attempt

HOST_SAMPLE_S = 5.0  # host RAM and CPU of a settled attempt: read this often
HOST_WARMUP_S = 10.0  # read at every pass for this long after an attempt is first seen


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        if HAVE_PROC:  # one read of /proc/<pid>/stat, not psutil's several per process
            stat = read_stat(pid)
            total += procstat.cpu_seconds(stat) if stat is not None else 0.0
            continue
        try:
            times = psutil.Process(pid).cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        total += times.user + times.system
    return total


def _peaks(attempt: Attempt) -> dict[str, int]:
    return {str(k): int(v) for k, v in attempt.peak_by_gpu.items() if isinstance(v, int)}


def _ranks(attempt: Attempt) -> dict[str, dict[str, Any]]:
    return {str(k): v for k, v in attempt.peak_by_rank.items() if isinstance(v, dict)}


class ResourceTracker:
    """Per-attempt readings between passes (CPU needs two readings to give a rate)."""

    def __init__(self, host: HostProbe | None, monotonic_s: Callable[[], float] = time.monotonic) -> None:
        self.host = host
        self._monotonic_s = monotonic_s
        self._cpu: dict[int, tuple[float, float]] = {}  # attempt id -> (cpu seconds, monotonic time)
        self._first_seen: dict[int, float] = {}  # attempt id -> monotonic time
        self._settled_at: float | None = None  # when settled attempts were last all read
        self._settled_due = False

    def new_pass(self) -> None:
        """Settled attempts are read together, in one pass every HOST_SAMPLE_S: the process
        table is then scanned for them once, not in most passes."""
        now = self._monotonic_s()
        self._settled_due = self._settled_at is None or now - self._settled_at >= HOST_SAMPLE_S
        if self._settled_due:
            self._settled_at = now

    def host_due(self, attempt: Attempt) -> bool:
        """Read host RAM and CPU in this pass: while the attempt ramps up, else once per HOST_SAMPLE_S."""
        now = self._monotonic_s()
        first = self._first_seen.setdefault(attempt.id, now)
        previous = self._cpu.get(attempt.id)
        return (previous is None or not attempt.reached_peak or now - first < HOST_WARMUP_S
                or self._settled_due or now - previous[1] >= HOST_SAMPLE_S)

    def fields(self, attempt: Attempt, pids: list[int], by_uuid: Mapping[str, GpuSnapshot],
               host_due: bool | None = None) -> dict[str, Any]:
        """Column updates for the attempt: per-card memory of a gang (its held/peak become the
        largest rank's), host RAM now and at its peak, CPU cores at their peak (when `host_due`;
        None: as `host_due()` says)."""
        fields: dict[str, Any] = {}
        uuids = attempt.cards
        if len(uuids) > 1:
            per_card = {u: by_uuid[u].memory_of(set(pids)) for u in uuids if u in by_uuid}
            if per_card != attempt.held_by_gpu:
                fields["held_by_gpu_json"] = json.dumps(per_card, sort_keys=True)
            peaks = {u: max(v, _peaks(attempt).get(u, 0)) for u, v in per_card.items()}
            if peaks != _peaks(attempt):
                fields["peak_by_gpu_json"] = json.dumps(peaks, sort_keys=True)
            rank_mib = max(per_card.values(), default=0)
            fields["held_mib"] = rank_mib
            if rank_mib > attempt.peak_mib:
                fields["peak_mib"] = rank_mib
        shares = [by_uuid[u].sm_of(set(pids)) for u in uuids if u in by_uuid]
        busiest = max((sm for sm in shares if sm is not None), default=None)
        if busiest != attempt.sm_pct:
            fields["sm_pct"] = busiest
        ranks = _ranks(attempt)
        for uuid in uuids:
            card = by_uuid.get(uuid)
            for process in card.processes if card is not None else ():
                if process.pid in pids and process.used_mib > ranks.get(str(process.pid), {}).get("mib", 0):
                    ranks[str(process.pid)] = {"gpu": uuid, "mib": process.used_mib}
        if ranks != _ranks(attempt):
            fields["peak_by_rank_json"] = json.dumps(ranks, sort_keys=True)
        if not (self.host_due(attempt) if host_due is None else host_due):
            return fields
        now = self._monotonic_s()
        if self.host is not None:
            host_mib = self.host.tree_mib(pids)
            if host_mib != attempt.host_held_mib:
                fields["host_held_mib"] = host_mib
            if host_mib > attempt.host_peak_mib:
                fields["host_peak_mib"] = host_mib
        used_s = cpu_seconds(pids)
        previous = self._cpu.get(attempt.id)
        self._cpu[attempt.id] = (used_s, now)
        if previous is not None and now > previous[1]:
            cores = round(max(0.0, used_s - previous[0]) / (now - previous[1]), 2)
            if cores > (attempt.cpu_peak_cores or 0.0):
                fields["cpu_peak_cores"] = cores
        return fields

    def forget(self, attempt_id: int) -> None:
        self._cpu.pop(attempt_id, None)
        self._first_seen.pop(attempt_id, None)

    def keep_only(self, attempt_ids: Iterable[int]) -> None:
        """Forget attempts no longer live (`forget` is called only for those that finished)."""
        keep = set(attempt_ids)
        self._cpu = {k: v for k, v in self._cpu.items() if k in keep}
        self._first_seen = {k: v for k, v in self._first_seen.items() if k in keep}
