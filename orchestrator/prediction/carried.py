"""OOM evidence carried across ladder rungs, and the level a job starts at. Pure: values in, values out.

An OOM at level i leaves a floor: the attempt needed at least what it held plus what it asked for.
Each rung after it removes some memory, so at level j the job needs at least about
`floor × saving(i+1) × … × saving(j)`, where a rung's saving (memory at its level over memory at the
level before) is, first that is known: learned from what the job's memory families measured at
both levels, the built-in LoRA worker's estimate at both levels, else 1 (the floor itself: no
rung is assumed to save what nothing has shown it saves). The figure an OOM'd attempt was placed
at is disproved for the job: no later attempt, at any level, is predicted at or below it.

A job whose level is known not to fit any card it may use starts at the first level predicted to
fit, preferring a rung that keeps numbers bit-equal; an exact level whose need nothing measured
(its saving assumed or estimated) is tried before an inexact one predicted to fit: the ladder does
not skip an exact rung on a guess.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.prediction.memory import Prediction
from orchestrator.store.peak_source import PredictionSource, SourceKind

MIB_PER_GIB = 1024


@dataclass(frozen=True)
class LevelEvidence:
    """What OOMs showed about the job's shape at one level."""

    level: int
    floor_mib: int | None = None  # the shape's OOM floor (held + asked for, grown on repeats)
    disproved_mib: int | None = None  # the most an OOM'd attempt of the shape was placed at


@dataclass(frozen=True)
class Carried:
    """The least a level may be predicted at, from OOM evidence at or below it."""

    mib: int
    level: int  # the level whose evidence sets it
    saving: float  # the product of the rungs' savings applied to that level's floor (1: none known)


def rung_savings(saving_of: Callable[[int], float | None], from_level: int, to_level: int) -> float:
    """Π saving_of(r) for the rungs r = from_level+1 … to_level, each clamped to (0, 1]; an
    unknown saving (None) counts as 1."""
    product = 1.0
    for rung in range(from_level + 1, to_level + 1):
        saving = saving_of(rung)
        if saving is not None and math.isfinite(saving) and saving > 0:
            product *= min(1.0, saving)
    return product


def carried_floor(
    evidence: Sequence[LevelEvidence], target: int, saving_of: Callable[[int], float | None]
) -> Carried | None:
    """The largest floor at or below `target`, scaled by the savings of the rungs between; None
    without floors. The target level's own floor counts unscaled."""
    best: Carried | None = None
    for seen in evidence:
        if seen.level > target or not seen.floor_mib:
            continue
        saving = rung_savings(saving_of, seen.level, target)
        mib = math.ceil(seen.floor_mib * saving)
        if best is None or mib > best.mib:
            best = Carried(mib, seen.level, saving)
    return best


def above_disproved(evidence: Sequence[LevelEvidence], target: int) -> int | None:
    """The least figure a prediction at `target` may take: one MiB above the most any OOM'd
    attempt of the job at or below it was placed at; None when no OOM gave one."""
    placed = [seen.disproved_mib for seen in evidence if seen.level <= target and seen.disproved_mib]
    return max(placed) + 1 if placed else None


@dataclass(frozen=True)
class LevelNeed:
    """What one level is predicted to need, and whether an OOM of its own shape proved it."""

    level: int
    mib: int  # the prediction (for a proven level: its own OOM floor)
    proven: bool  # its own shape's OOM floor is above the cards: it cannot fit
    exact: bool  # its rung and every one before it keep numbers bit-equal
    # memory was measured at this level (its shape's peak or OOM, a running attempt, its family);
    # False: its figure rests on a saving assumed or estimated from the levels below
    measured: bool = False


@dataclass(frozen=True)
class StartChoice:
    level: int
    note: str  # "started at level 2: level 0 needs ≥ 24.6 GiB, the cards hold 24 GiB"


def gib(mib: float) -> str:
    """`24 GiB`, `24.6 GiB`: one decimal where it matters."""
    value = mib / MIB_PER_GIB
    return f"{value:.0f} GiB" if abs(value - round(value)) < 0.05 else f"{value:.1f} GiB"


def start_level(
    needs: Sequence[LevelNeed], current: int, ceiling_mib: int, verb: str = "started",
) -> StartChoice | None:
    """Where a job now at `current` should start when the level it is at cannot fit any card it
    may use (`ceiling_mib`: the largest such card less its headroom): the first later level
    predicted to fit, the first exact one if any exact one fits; while only inexact ones are
    predicted to fit, the first exact one whose need nothing measured (not skipped on a guess).
    When none is predicted to fit, the first later level not proven too large (its saving may be
    more than anything has shown yet). None: `current` may fit, is an exact level nothing
    measured (it is tried), or nothing later is left (the job runs as it is, or fails saying so:
    `no_level_fits`). `needs`: one per level from `current` on."""
    by_level = {need.level: need for need in needs}
    here = by_level.get(current)
    if here is None or here.mib <= ceiling_mib:
        return None
    later = [need for need in needs if need.level > current]
    fitting = [need for need in later if need.mib <= ceiling_mib]
    exact_fitting = [need for need in fitting if need.exact]
    if here.exact and not (here.proven or here.measured or exact_fitting):
        return None  # an exact level nothing measured is tried, not left on a guess
    exact_unmeasured = [need for need in later if need.exact and not (need.proven or need.measured)]
    # a level only predicted too large is left only for one predicted to fit
    untried = [need for need in later if not need.proven] if here.proven else []
    choices = exact_fitting or (exact_unmeasured if fitting else []) or fitting or untried
    if not choices:
        return None
    chosen = choices[0]
    worded = "needs" if here.proven else "is predicted to need"
    note = (f"{verb} at level {chosen.level}: level {current} {worded} ≥ {gib(here.mib)}, "
            f"the cards hold {gib(ceiling_mib)} after headroom")
    if chosen.mib > ceiling_mib and fitting:
        note += (f" (level {chosen.level} keeps numbers bit-equal and is tried before level "
                 f"{fitting[0].level}, which changes them: nothing has measured what it saves yet)")
    elif chosen.mib > ceiling_mib:
        note += f" (level {chosen.level} is tried: no rung has shown how much it saves yet)"
    return StartChoice(chosen.level, note)


def no_level_fits(needs: Sequence[LevelNeed], ceiling_mib: int) -> str | None:
    """Why a job fails before it starts: every level left is proven not to fit (each one's own OOM
    floor is above the cards). None while one may fit."""
    if not needs or not all(need.proven and need.mib > ceiling_mib for need in needs):
        return None
    least = min(needs, key=lambda need: need.mib)
    return (f"no level of its ladder fits: level {least.level} needs ≥ {gib(least.mib)}, "
            f"the cards hold {gib(ceiling_mib)} after headroom")


# Predictions of the shape itself measured at the level: a floor carried from below with an
# assumed saving does not overrule them (the figure an OOM disproved still does). A family fit is
# borrowed from other shapes, so the carried floor still raises it.
_MEASURED_HERE = (SourceKind.MEASURED, SourceKind.RUNNING)


def with_evidence(
    prediction: Prediction, evidence: Sequence[LevelEvidence], target: int,
    saving_of: Callable[[int], float | None],
) -> Prediction:
    """`prediction` for level `target`, raised to what OOMs at or below it support: the carried
    floor (unless the shape has measurements of its own at the level), and one MiB above every figure an OOM
    disproved."""
    if not evidence:
        return prediction
    carried = carried_floor(evidence, target, saving_of)
    if carried is not None and carried.mib > prediction.mib and prediction.source.kind not in _MEASURED_HERE:
        prediction = Prediction(carried.mib, PredictionSource(SourceKind.OOM_FLOOR, level=carried.level))
    least = above_disproved(evidence, target)
    if least is not None and least > prediction.mib:
        prediction = Prediction(least, PredictionSource(SourceKind.OOM_FLOOR))
    return prediction
