"""OOM evidence carried across ladder rungs and start where it fits, as the benchmark's orch
policies replay them over a trace's ladder (the daemon's orchestrator.prediction.carried and
orchestrator.scheduling.start_levels). Trace jobs have no estimate: a rung's saving is unknown,
so a floor carries as it is."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from orchestrator.prediction.carried import (
    LevelEvidence,
    LevelNeed,
    StartChoice,
    start_level,
    with_evidence,
)
from orchestrator.prediction.ladder import Level, inexact_rungs
from orchestrator.prediction.memory import Prediction
from orchestrator.store.peak_source import SourceKind
from orchestrator.store.rows import ShapeMemory

K = TypeVar("K")
EVIDENCE = (SourceKind.OOM_FLOOR, SourceKind.MEASURED, SourceKind.RUNNING, SourceKind.FAMILY)


def carried(prediction: Prediction, shapes: Mapping[K, ShapeMemory], key_at: Callable[[int], K],
            level: int) -> Prediction:
    """`prediction` for `level`, raised to the OOM evidence of the job's shapes at or below it."""
    evidence = []
    for below in range(level + 1):
        memory = shapes.get(key_at(below))
        if memory is not None and (memory.oom_floor_mib or memory.disproved_mib):
            evidence.append(LevelEvidence(below, memory.oom_floor_mib, memory.disproved_mib))
    return with_evidence(prediction, evidence, level, lambda rung: None)


def start_choice(levels: Sequence[Level], level: int, ceiling_mib: int, shapes: Mapping[K, ShapeMemory],
                 key_at: Callable[[int], K], predicted_at: Callable[[int], Prediction]) -> StartChoice | None:
    """Where a job at `level` starts when evidence shows `level` above every card (None: it stays)."""
    here = predicted_at(level)
    if here.mib <= ceiling_mib or here.source.kind not in EVIDENCE:
        return None
    needs = []
    for later in range(level, len(levels)):
        memory = shapes.get(key_at(later))
        floor = memory.oom_floor_mib if memory is not None else None
        proven = floor is not None and floor > ceiling_mib
        mib = floor if proven and floor is not None else predicted_at(later).mib
        needs.append(LevelNeed(later, mib, proven, not inexact_rungs(levels, later)))
    return start_level(needs, level, ceiling_mib)
