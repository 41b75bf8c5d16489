"""An attempt's metric history as points (step, key, value), and the downsampling that keeps
it bounded. Pure: records and text in, points out.

Points come from what a worker reported: each `progress.jsonl` line (a mapping with a `step`;
a nested mapping one level down, `{"val": {"accuracy": 0.8}}`, becomes `val_accuracy`), the
lines of stdout the printed-metrics parser understands (attempts.printed_metrics), and the
final metrics of result.json, placed at the last step reported under their own names where the
run logged the same key (`best_val_accuracy` at the result's `best_step`, never over a logged
point: a curve ends at its last logged value).
Everything is written by user code: keys are short text, values finite numbers, at most
store.history_bounds.MAX_KEYS keys per attempt; the rest is dropped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.store.history_bounds import Point
from orchestrator.wording import MAX_METRIC

MAX_KEY_CHARS = 64
MAX_LINE_CHARS = 65536  # a progress.jsonl line longer than this is not a record: skipped whole
MAX_STEP = 1e15
# What a heartbeat says about the loop itself, not about the model: never a history key.
NOT_HISTORY = frozenset({
    "t", "ts", "time", "step", "global_step", "train_step", "optimizer_step", "iteration", "iter", "total",
    "max_steps", "epoch", "samples_per_s", "peak_mem_mib",
    "eval_batches_done", "eval_batches", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second",
    "train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos",
})


def finite(value: Any) -> float | None:
    """A finite float from a JSON number of magnitude at most wording.MAX_METRIC (bools and
    larger numbers are not values here, as they are no metric's)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or abs(value) > MAX_METRIC:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _key_ok(key: Any) -> bool:
    return isinstance(key, str) and 0 < len(key) <= MAX_KEY_CHARS and key.isprintable()


def flat_metrics(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Finite numbers of a mapping, one nested level flattened (`val` → `val_accuracy`)."""
    flat: dict[str, float] = {}
    for key, raw in values.items():
        if not _key_ok(key) or key in NOT_HISTORY:
            continue
        name = f"{prefix}{key}"
        if isinstance(raw, Mapping) and not prefix:
            flat.update(flat_metrics(raw, f"{key}_"))
            continue
        number = finite(raw)
        if number is not None and len(name) <= MAX_KEY_CHARS:
            flat[name] = number
    return flat


# What names a record's position when it has no `step`, in order (a step-like key, then epoch).
STEP_FALLBACKS = ("global_step", "train_step", "optimizer_step", "iteration", "iter", "epoch")


def record_step(record: Any) -> float | None:
    """A progress.jsonl record's step: its `step` (without one, a step-like key's or its `epoch`);
    None when it has none in range, or it is no record."""
    if not isinstance(record, dict):
        return None
    at = "step" if "step" in record else next((k for k in STEP_FALLBACKS if k in record), None)
    step = finite(record.get(at)) if at is not None else None
    return step if step is not None and 0 <= step <= MAX_STEP else None


def record_points(record: Any) -> list[Point]:
    """The points of one progress.jsonl record: every metric at its step (`record_step`); none
    when it has no step."""
    step = record_step(record)
    if step is None:
        return []
    return [Point(step, key, value) for key, value in flat_metrics(record).items()]


def record_loss(record: Any) -> float | None:
    """A progress.jsonl record's `loss` as a float, NaN and infinities kept (the history keeps
    finite values only; a non-finite loss is the divergence rule's evidence); None: no loss, or
    the record has no step (`record_step`)."""
    if record_step(record) is None:
        return None
    loss = record.get("loss")
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or (isinstance(loss, int) and abs(loss) > 1e300):
        return None
    return float(loss)


def reported_losses(text: str) -> list[float]:
    """The `loss` of each complete progress.jsonl line of `text`, in order (`record_loss`)."""
    losses = []
    for line in text.split("\n"):
        if not line.strip() or len(line) > MAX_LINE_CHARS:
            continue
        try:
            loss = record_loss(json.loads(line))  # `NaN` and `Infinity` read as floats
        except (ValueError, RecursionError):
            continue
        if loss is not None:
            losses.append(loss)
    return losses


def final_points(metrics: Mapping[str, Any], step: float, logged: frozenset[str] | set[str] = frozenset(),
                 best_step: float | None = None) -> list[Point]:
    """An attempt's final metrics (result.json's, flattened: `test_accuracy`) at its last step,
    each under a name of its own where the run logged that key as it went (`logged`): a final
    value is never a point of a logged curve. A logged val metric is the best evaluation's
    (`best_val_accuracy` at `best_step`, where the result names it), any other `final_<key>`."""
    points = []
    for key, value in flat_metrics(metrics).items():
        name, at = key, step
        if key in logged and best_step is not None and key.startswith("val"):
            name, at = f"best_{key}", best_step
        elif key in logged:
            name = f"final_{key}"
        if len(name) <= MAX_KEY_CHARS and at is not None:
            points.append(Point(at, name, value))
    return points


@dataclass
class JsonLines:
    """progress.jsonl fed in chunks as it grows: points of each complete line."""

    carry: str = ""
    skip_first: bool = False  # reading started inside the file (or a line too long): skip to its end

    def feed(self, text: str) -> list[Point]:
        lines = (self.carry + text).split("\n")
        self.carry = lines.pop()  # a line being written
        if self.skip_first and lines:
            lines.pop(0)
            self.skip_first = False
        if len(self.carry) > MAX_LINE_CHARS:  # bounded: that line is skipped up to its end, only it
            self.carry, self.skip_first = "", True
        points: list[Point] = []
        for line in lines:
            if not line.strip() or len(line) > MAX_LINE_CHARS:
                continue
            try:
                record = json.loads(line, parse_constant=lambda token: None)
            except (ValueError, RecursionError):
                continue
            points += record_points(record)
        return points
