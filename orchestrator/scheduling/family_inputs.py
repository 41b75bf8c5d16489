"""What one scheduling pass takes from memory families (orchestrator.prediction.families): each shape's
place in its family, which jobs and live attempts probe (probe before stacking), and the
co-location curve a job stacks by. Pure but for `family_tags`, which reads the learned shapes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from orchestrator.prediction.job_facts import (
    JobFacts,
    JobShapeCache,
    attempt_family_tag,
    attempt_shape_key,
)
from orchestrator.prediction.learned import Knowledge
from orchestrator.scheduling.packing.types import RunningAttempt
from orchestrator.store.db import Store
from orchestrator.store.learning import read_family_members
from orchestrator.store.peak_source import PredictionSource, SourceKind
from orchestrator.store.rows import Attempt, FamilyTag, Job


def family_tags(store: Store, live: Sequence[Attempt], live_jobs: Mapping[int, Job],
                cache: JobShapeCache) -> dict[str, FamilyTag]:
    """Shape key -> its place in its memory family, for every learned shape and live attempt."""
    tags = {m.shape_key: m.tag for m in read_family_members(store)}
    for attempt in live:
        job = live_jobs.get(attempt.job_id)
        if job is not None and (tag := attempt_family_tag(job, attempt, cache)) is not None:
            tags[attempt_shape_key(job, attempt, cache)] = tag
    return tags


def curve_of(facts: JobFacts, curves: Mapping[str, Mapping[int, Mapping[int, float]]],
             by_family: Mapping[str, Mapping[int, Mapping[int, float]]]) -> Mapping[int, Mapping[int, float]] | None:
    """The co-location curve a job stacks by: its memory family's (learned by any of its
    configs), else its own shape's."""
    tag = facts.shape.family
    return (by_family.get(tag.family_key) if tag is not None else None) or curves.get(facts.shape.shape_key)


# Predictions that may rest on nothing measured on this machine (RUNNING: what a live attempt holds
# before step K, while its family has measured nothing); the estimate is a fitted model, not a guess
_GUESSES = (SourceKind.DECLARED, SourceKind.NONE, SourceKind.OOM_FLOOR, SourceKind.RUNNING)


def probe_family(facts: JobFacts, source: PredictionSource, knowledge: Knowledge) -> str | None:
    """The job's family while its memory rests on nothing measured: such jobs probe, one per
    family per card, until one reaches step K (orchestrator.scheduling.packing.pack)."""
    tag = facts.shape.family
    if tag is None or source.kind not in _GUESSES or knowledge.family_measured(tag.family_key):
        return None
    return tag.family_key


def mark_probes(running: list[RunningAttempt], live: Sequence[Attempt], live_jobs: Mapping[int, Job],
                knowledge: Knowledge, cache: JobShapeCache) -> list[RunningAttempt]:
    """Live attempts of families that have measured nothing: their cards take no other job of
    the family until one of them reaches step K."""
    probes: dict[int, str] = {}
    for attempt in live:
        job = live_jobs.get(attempt.job_id)
        tag = attempt_family_tag(job, attempt, cache) if job is not None else None
        if tag is not None and not knowledge.family_measured(tag.family_key):
            probes[attempt.job_id] = tag.family_key
    if not probes:
        return running
    return [replace(r, probe_family=probes[r.job_id]) if r.job_id in probes else r for r in running]
