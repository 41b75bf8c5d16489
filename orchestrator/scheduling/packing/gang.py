"""Jobs bigger than one GPU, and the host's scarce resources, for `orchestrator.scheduling.packing.pack`. Pure.

A gang (a job with `gpus: N > 1`) starts only when N allowed cards each fit its per-rank peak at
once; among the cards that fit, the closest set in the machine's topology wins. A gang that does
not fit reserves cards as they free up: a reserved card takes only jobs expected to end before
the reservation completes (backfill), so a stream of one-GPU jobs cannot starve it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestrator.scheduling.waits import Wait, WaitKind

T = TypeVar("T")

# Above this many candidate sets the closest set is chosen greedily (C(16, 8) is 12870 sets).
_MAX_COMBINATIONS = 5000


@dataclass
class HostState:
    """The host's memory and cores as one `pack` call sees them (and spends them)."""

    available_mib: int  # available memory minus the reserve minus what ramping attempts still take
    total_mib: int
    free_cpus: int | None = None  # cores not promised to running attempts; None: not tracked


def distance(topology: Mapping[tuple[int, int], int] | None, a: int, b: int) -> int:
    """How far apart two GPUs are (0 = same board/NVLink; larger = further); 0 when unknown."""
    if topology is None or a == b:
        return 0
    return topology.get((min(a, b), max(a, b)), 0)


def closest_set(
    candidates: Sequence[T], n: int, index: Callable[[T], int],
    topology: Mapping[tuple[int, int], int] | None, preference: Callable[[T], Any],
) -> list[T]:
    """The n candidates with the smallest summed pairwise distance; ties go to the set whose
    worst member by `preference` is best (then the next worst, ...). The result is in GPU index
    order (CUDA_VISIBLE_DEVICES order). `candidates` holds at least n items."""
    ranked = sorted(candidates, key=preference)
    if math.comb(len(ranked), n) > _MAX_COMBINATIONS:
        chosen = [ranked[0]]
        rest = ranked[1:]
        while len(chosen) < n:
            best = min(rest, key=lambda c: sum(distance(topology, index(c), index(o)) for o in chosen))
            chosen.append(best)
            rest.remove(best)
        return sorted(chosen, key=index)
    best_set: tuple[T, ...] | None = None
    best_cost: tuple[int, tuple[int, ...]] | None = None
    for combo in itertools.combinations(range(len(ranked)), n):
        cost = sum(
            distance(topology, index(ranked[i]), index(ranked[j])) for i, j in itertools.combinations(combo, 2)
        )
        key = (cost, tuple(sorted(combo, reverse=True)))  # positions in `ranked`: worst member first
        if best_cost is None or key < best_cost:
            best_cost, best_set = key, tuple(ranked[i] for i in combo)
    assert best_set is not None
    return sorted(best_set, key=index)


def ready_at_s(now_s: float, ends_s: Sequence[float | None]) -> float:
    """When a card whose running attempts end at `ends_s` is empty; inf when one end is unknown."""
    if any(end is None for end in ends_s):
        return math.inf
    return max([now_s, *(float(e) for e in ends_s if e is not None)])


def may_backfill(expected_duration_s: float | None, now_s: float, reservation_ready_s: float) -> bool:
    """A job may use a card reserved for a waiting gang only if it is expected to end before the
    reservation completes; a job of unknown length, or a reservation of unknown end, never may."""
    if expected_duration_s is None or math.isinf(reservation_ready_s):
        return False
    return now_s + expected_duration_s <= reservation_ready_s


def host_blocker(host_mib: int, cpus: int | None, host: HostState | None) -> Wait | None:
    """Why a job cannot start for want of host RAM or cores, or None."""
    if host is None:
        return None
    if host_mib > host.available_mib:
        return Wait(WaitKind.HOST_RAM, free_mib=host.available_mib, need_mib=host_mib)
    if cpus is not None and host.free_cpus is not None and cpus > host.free_cpus:
        return Wait(WaitKind.HOST_CPUS, free_cpus=host.free_cpus, cpus=cpus)
    return None


def spend(host: HostState | None, host_mib: int, cpus: int | None) -> None:
    if host is None:
        return
    host.available_mib -= host_mib
    if cpus is not None and host.free_cpus is not None:
        host.free_cpus -= cpus
