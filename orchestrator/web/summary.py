"""Sweep figures from attempt spans (pure): GPU-hours busy, attempt-hours, packing density."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.store.web_queries import AttemptSpan


@dataclass(frozen=True)
class Occupancy:
    attempt_hours: float  # Σ attempt durations: each attempt counted on its own
    gpu_hours: float  # Σ over GPUs of the time at least one attempt ran there
    packing_density: float | None  # attempt_hours / gpu_hours: mean attempts on a busy GPU


def occupancy(spans: Iterable[AttemptSpan], now_s: float) -> Occupancy:
    by_gpu: dict[int, list[tuple[float, float]]] = {}
    attempt_s = 0.0
    for s in spans:
        end = s.ended_at if s.ended_at is not None else now_s
        if end <= s.started_at:
            continue
        attempt_s += end - s.started_at
        by_gpu.setdefault(s.gpu, []).append((s.started_at, end))
    busy_s = sum(_union_length(intervals) for intervals in by_gpu.values())
    return Occupancy(attempt_s / 3600, busy_s / 3600, (attempt_s / busy_s) if busy_s > 0 else None)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total
