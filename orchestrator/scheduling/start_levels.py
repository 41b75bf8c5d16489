"""Start where it fits: queued jobs whose ladder level is known not to fit any card they may use
move to the first level predicted to fit (orchestrator.prediction.carried.start_level), before
`pack` places anything. Pure but for the predictions it fills into the caches it is given; the
pass (orchestrator.scheduling.dispatch) writes the moves.

Only evidence moves a job: an OOM floor, a measured peak or a family fit above the cards. A
declared figure or an estimate above them is capped instead (`pack`), and the job tries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.prediction.carried import LevelNeed, no_level_fits, start_level
from orchestrator.prediction.fused_groups import shares_base
from orchestrator.prediction.job_facts import (
    JobFacts,
    JobShapeCache,
    job_host_settings,
    job_ladder,
    job_levels,
    shape_facts,
)
from orchestrator.prediction.job_prediction import predict_for
from orchestrator.prediction.ladder import inexact_rungs, with_host_settings
from orchestrator.scheduling.pack_inputs import PassReadings
from orchestrator.scheduling.packing.cards import headroom_mib
from orchestrator.scheduling.packing.types import GpuState, PackingPolicy
from orchestrator.store.peak_source import SourceKind
from orchestrator.store.rows import Job, QueueEntry

# Predictions that rest on what this machine saw of the shape: enough to move a job off its level.
_EVIDENCE = (SourceKind.OOM_FLOOR, SourceKind.MEASURED, SourceKind.RUNNING, SourceKind.FAMILY)
# Predictions from memory measured at the level (beside its shape's own peak or OOM): what its
# rungs save is known (a floor carried from below rests on a saving assumed or estimated).
_MEASURED = (SourceKind.MEASURED, SourceKind.RUNNING, SourceKind.FAMILY)


@dataclass(frozen=True)
class LevelMove:
    """Queued jobs of one kind and where they go: to `level` with `note`, or (`level` None) to
    `failed` with `note` as the reason."""

    job_ids: tuple[int, ...]
    level: int | None
    note: str


def usable_ceiling_mib(gpus: Sequence[GpuState], policy: PackingPolicy, allowed: Iterable[int] | None) -> int | None:
    """The largest card the job may use, less its headroom; None when it may use none."""
    allowed_set = None if allowed is None else set(allowed)
    sizes = [g.total_mib - headroom_mib(g, policy) for g in gpus
             if g.slots > 0 and (allowed_set is None or g.index in allowed_set)]
    return max(sizes, default=None)


def level_needs(job: Job, facts: JobFacts, readings: PassReadings, cache: JobShapeCache,
                ceiling_mib: int) -> list[LevelNeed]:
    """What each level from the job's own on is predicted to need, whether its own OOM floor
    proves it too large, and whether it keeps numbers bit-equal."""
    levels = job_levels(job, cache)
    host = job_host_settings(job)
    needs = []
    for level in levels[facts.level.index:]:
        at = with_host_settings(level, host)
        shape = facts.shape if level.index == facts.level.index else shape_facts(job, at, cache)
        mib, source = predict_for(shape, job, at, readings.shapes, readings.prompt_lengths, cache,
                                  readings.knowledge)
        memory = readings.shapes.get(shape.shape_key)
        floor = memory.oom_floor_mib if memory is not None else None
        proven = floor is not None and floor > ceiling_mib
        seen = memory is not None and bool(
            memory.peak_mib or memory.oom_floor_mib or memory.disproved_mib)
        # a proven level is shown at its floor: what it needs at least, not a figure with margins
        needs.append(LevelNeed(level.index, floor if proven and floor is not None else mib, proven,
                               not inexact_rungs(levels, level.index),
                               seen or source.kind in _MEASURED))
    return needs


def start_moves(rows: Sequence[QueueEntry], facts_of: Mapping[int, JobFacts], readings: PassReadings,
                cache: JobShapeCache, gpus: Sequence[GpuState], policy: PackingPolicy) -> list[LevelMove]:
    """The moves of this pass: for each kind of queued job (one facts object, shared by jobs alike)
    whose level is above every card it may use on evidence, the level to start at, or why it
    fails."""
    members: dict[int, list[int]] = {}
    kinds: dict[int, JobFacts] = {}
    for row in rows:
        facts = facts_of.get(row.id)
        if facts is not None and facts.gpus == 1:
            members.setdefault(id(facts), []).append(row.id)
            kinds[id(facts)] = facts
    moves = []
    for key, facts in kinds.items():
        job = facts.shape.job  # a job of the kind: its config and ladder
        ceiling = usable_ceiling_mib(gpus, policy, facts.allowed)
        if ceiling is None:
            continue
        mib, source = predict_for(facts.shape, job, facts.level, readings.shapes, readings.prompt_lengths, cache,
                                  readings.knowledge)
        # a measured peak's margin counts within the headroom the ceiling leaves (packing.cards)
        if mib - source.margin_within_headroom_mib(shares_base(job)) <= ceiling or source.kind not in _EVIDENCE:
            continue
        needs = level_needs(job, facts, readings, cache, ceiling)
        choice = start_level(needs, facts.level.index, ceiling, verb="starts" if facts.level.index == 0 else "goes on")
        if choice is not None:
            moves.append(LevelMove(tuple(members[key]), choice.level, choice.note))
        elif (why := no_level_fits(needs, ceiling)) is not None:
            strict = " (a strict ladder: exact rungs only)" if job_ladder(job).strict else ""
            moves.append(LevelMove(tuple(members[key]), None, why + strict))
    return moves
