"""Memory families: jobs whose received configs differ only in batch size (and sequence length),
with one fit of peak ≈ fixed + per-unit × batch (× tokens) over what the family has measured.
Pure: values in, values out; the scheduler and the packing benchmark both ask it.

A sweep is mostly shapes that never ran: a config at a new batch size, a ladder rung that halves
the batch. Their members share the weights, adapter states and CUDA context (the fixed part) and
differ in activations, which grow with the samples (and tokens) of a step. So one measured member
predicts the rest: at a smaller batch, its own peak bounds them from above (memory never shrinks
with more samples); at a larger one, its peak scaled by the batch ratio does (the fixed part does
not grow). Two members at different batches give the line; its largest residual over the points
is the fit's error, and the margin a prediction gets grows with it. An OOM's floor (what the
attempt held plus what it asked for) bounds its own batch from below, and, scaled by the fit's
growth, every larger batch.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.store.rows import FamilyTag

# Keys that size a step's activations: a family's members may differ in them (the fit's x).
BATCH_KEYS: tuple[str, ...] = ("batch_size", "per_device_train_batch_size", "train_batch_size")
TOKEN_KEYS: tuple[str, ...] = ("max_seq_len", "max_length", "max_seq_length", "seq_len", "block_size")
ACCUMULATION_KEYS: tuple[str, ...] = ("gradient_accumulation_steps",)

BASE_MARGIN = 0.05  # a prediction from one completed point: as a shape's own measured peak
RUNNING_MARGIN = 0.10  # a point that is a running attempt's peak so far (step K): it may grow a little
ERROR_FACTOR = 2.0  # the margin covers twice the fit's largest relative residual
MAX_MARGIN = 0.5


@dataclass(frozen=True)
class FamilyPoint:
    batch_size: int
    tokens: int | None
    task: str
    peak_mib: int
    running: bool = False  # a live attempt's peak so far, past step K


@dataclass(frozen=True)
class FamilyFloor:
    batch_size: int
    tokens: int | None
    task: str
    floor_mib: int  # at least this (an OOM: held + asked for)


@dataclass(frozen=True)
class FamilyFit:
    """peak ≈ fixed_mib + per_unit_mib × x, x = batch (× tokens when `per_token`)."""

    fixed_mib: float
    per_unit_mib: float
    per_token: bool
    error_fraction: float  # largest |residual| / peak over the points (0 with one batch size)
    margin_fraction: float  # what a prediction inside the measured range gets
    points: tuple[FamilyPoint, ...]
    floors: tuple[FamilyFloor, ...]
    x_min: float
    x_max: float  # the largest x measured: beyond it the fit extrapolates

    def at(self, x: float) -> float:
        return self.fixed_mib + self.per_unit_mib * x


def family_of(
    memory_config: Mapping[str, Any], model: str, task: str, batch_key: str | None = None,
    tokens: int | None = None,
) -> FamilyTag | None:
    """The family of a shape from its memory-relevant config: everything but the batch size,
    gradient accumulation and sequence length, plus the model. `batch_key`: the script's name
    for the batch size (the suite's `keys:`), else the common names. None: no batch size known."""
    keys = (batch_key,) if batch_key else BATCH_KEYS
    batch = next((v for k in keys if _positive_int(v := memory_config.get(k))), None)
    if batch is None:
        return None
    varying = {*keys, *BATCH_KEYS, *ACCUMULATION_KEYS, *TOKEN_KEYS}
    rest = {k: v for k, v in sorted(memory_config.items()) if k not in varying}
    if tokens is None:
        tokens = next((v for k in TOKEN_KEYS if _positive_int(v := memory_config.get(k))), None)
    digest = hashlib.sha256(json.dumps(rest, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return FamilyTag(f"{digest}|{model}", int(batch), tokens, task)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _x(batch: int, tokens: int | None, per_token: bool) -> float:
    return float(batch * (tokens or 1)) if per_token else float(batch)


def fit_family(points: Sequence[FamilyPoint], floors: Sequence[FamilyFloor] = ()) -> FamilyFit | None:
    """The least-squares line through the points (tokens multiply the batch when every point
    knows them); None without points. Fixed and per-unit parts are never negative."""
    if not points:
        return None
    per_token = all(p.tokens for p in points)
    xs = [_x(p.batch_size, p.tokens, per_token) for p in points]
    ys = [float(p.peak_mib) for p in points]
    distinct = set(xs)
    if len(distinct) == 1:
        # one batch size: no slope to fit; its peak bounds smaller members, and scaled by the
        # batch ratio (no fixed part) larger ones, both from above
        fixed, per_unit = max(ys), 0.0
        error = 0.0
    else:
        n = len(xs)
        mean_x, mean_y = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mean_x) ** 2 for x in xs)
        per_unit = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx)
        fixed = mean_y - per_unit * mean_x
        if fixed < 0:  # through the origin instead: the steepest ratio, which covers every point
            fixed, per_unit = 0.0, max(y / x for x, y in zip(xs, ys, strict=True))
        error = max(abs(fixed + per_unit * x - y) / y for x, y in zip(xs, ys, strict=True))
    # two points at two batch sizes fit any line exactly: only a third shows the error
    spare = len(points) - min(len(distinct), 2) + 1
    base = RUNNING_MARGIN if any(p.running for p in points) else BASE_MARGIN / math.sqrt(spare)
    margin = min(MAX_MARGIN, max(base, 0.02, ERROR_FACTOR * error))
    return FamilyFit(fixed, per_unit, per_token, error, margin, tuple(points), tuple(floors), min(xs), max(xs))


def across_families(points: Sequence[FamilyPoint], task: str, batch_size: int,
                    others: Iterable[Sequence[FamilyPoint]]) -> float | None:
    """A member on a task its family has not run, from the family's points on other tasks scaled
    by how the member's task compares with theirs in other families (of the same model) that ran
    both at one batch size: a task's prompts size the activations alike in every family. The
    geometric mean over every such (point, family) pair, each point scaled up to a larger batch
    as one measured batch is. None: no other family ran the member's task beside one of these."""
    peaks_of = []
    for other in others:
        peaks: dict[tuple[str, int], int] = {}
        for q in other:
            peaks[(q.task, q.batch_size)] = max(peaks.get((q.task, q.batch_size), 0), q.peak_mib)
        if any(key[0] == task for key in peaks):
            peaks_of.append(peaks)
    logs = [
        math.log(p.peak_mib * peaks[(task, p.batch_size)] / peaks[(p.task, p.batch_size)]
                 * max(1.0, batch_size / p.batch_size))
        for p in points for peaks in peaks_of
        if peaks.get((task, p.batch_size)) and peaks.get((p.task, p.batch_size)) and p.peak_mib > 0
    ]
    return math.exp(sum(logs) / len(logs)) if logs else None


def predict_member(fit: FamilyFit | None, batch_size: int, tokens: int | None, task: str,
                   floors: Iterable[FamilyFloor] = (),
                   prompt_tokens: Callable[[str], int | None] | None = None,
                   others: Iterable[Sequence[FamilyPoint]] = ()) -> tuple[int, float] | None:
    """(predicted peak, margin used) for a member at `batch_size` (sized at `tokens`, where its
    config says) on `task`, or None when the family has measured nothing. The points of the
    member's own task are fitted where there are any. Other tasks see other prompts, which a
    configured length only bounds: their points count scaled by the learned prompt lengths
    (`prompt_tokens(task)`, where the worker reports them, for this task and theirs); else by how
    the tasks compare in `others`, the points of other families of the same model
    (`across_families`); else the family's largest peak (scaled up to a larger batch) bounds the
    member."""
    if fit is None:
        return None
    own = [p for p in fit.points if p.task == task]
    lengths = {p.task: prompt_tokens(p.task) for p in fit.points} if prompt_tokens is not None else {}
    learned = prompt_tokens(task) if prompt_tokens is not None else None
    scaled = not own and bool(learned) and all(lengths.values())
    if own and len(own) < len(fit.points):
        fit = fit_family(own, fit.floors) or fit
    elif scaled:  # every point at its task's learned length, the member at its own
        fit = fit_family([FamilyPoint(p.batch_size, lengths[p.task], p.task, p.peak_mib, p.running)
                          for p in fit.points], fit.floors) or fit
        tokens = learned
    per_token = fit.per_token and bool(tokens)
    if fit.per_token and not tokens:  # the member's length is unknown: fit on batch alone
        fit = fit_family([FamilyPoint(p.batch_size, None, p.task, p.peak_mib, p.running) for p in fit.points],
                         fit.floors) or fit
        per_token = False
    x = _x(batch_size, tokens, per_token)
    # one batch size measured: its peak, scaled up to a larger batch
    raw = fit.fixed_mib * max(1.0, x / fit.x_max) if fit.x_min == fit.x_max else fit.at(x)
    margin = fit.margin_fraction
    if x > fit.x_max and fit.per_unit_mib > 0:  # extrapolating: the slope's error grows with the distance
        margin = min(MAX_MARGIN, margin + fit.error_fraction * (x / fit.x_max - 1.0))
    if not own and not scaled:
        # another task, its prompt lengths unknown: as the tasks compare in other families, else
        # the family's largest peak bounds the member
        across = across_families(fit.points, task, batch_size, others)
        if across is not None:
            # never below the family's own fit at the member's size: the comparison is by task
            # and batch only, and a member with longer sequences holds more
            raw = max(raw, across)
        else:
            largest = max(fit.points, key=lambda p: p.peak_mib)
            raw = max(raw, largest.peak_mib * max(1.0, batch_size / largest.batch_size))
    for floor in floors:
        if floor.batch_size <= batch_size and (floor.task == task or not own):
            growth = 1.0
            if fit.per_unit_mib > 0:
                at_floor = fit.at(_x(floor.batch_size, floor.tokens or tokens, per_token))
                growth = max(1.0, fit.at(x) / at_floor) if at_floor > 0 else 1.0
            raw = max(raw, floor.floor_mib * growth)
    return math.ceil(raw * (1 + margin)), margin


def least_member_mib(points: Iterable[FamilyPoint], floors: Iterable[FamilyFloor], batch_size: int,
                     tokens: int | None, task: str) -> int | None:
    """The least a member at `batch_size` (sized at `tokens`) on `task` could need, from its
    family's points and OOM floors on that task: memory never shrinks with more samples or longer
    sequences, so a point (or floor) at a batch and length no larger bounds it from below at its
    own figure; and at one length, activations grow with the batch and the fixed part is never
    negative, so a point at a larger batch does at its peak scaled down by the ratio. A point at
    another length and a larger batch says nothing (attention may grow faster than the length).
    None: no point on its task bounds it."""
    def no_larger(other_batch: int, other_tokens: int | None) -> bool:
        return other_batch <= batch_size and (other_tokens == tokens or (
            other_tokens is not None and tokens is not None and other_tokens <= tokens))

    found = []
    for p in points:
        if p.task != task or p.peak_mib <= 0:
            continue
        if no_larger(p.batch_size, p.tokens):
            found.append(p.peak_mib)
        elif p.tokens == tokens:  # one length, a larger batch
            found.append(math.floor(p.peak_mib * batch_size / p.batch_size))
    if not found:
        return None
    bounds = [f.floor_mib for f in floors if f.task == task and no_larger(f.batch_size, f.tokens)]
    return max(found + bounds)


def floors_bound(floors: Iterable[FamilyFloor], batch_size: int) -> int | None:
    """The largest OOM floor at this batch or a smaller one: a lower bound on the member."""
    found = [f.floor_mib for f in floors if f.batch_size <= batch_size]
    return max(found) if found else None
