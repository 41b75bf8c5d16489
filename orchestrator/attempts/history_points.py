"""An attempt's metric history as points (step, key, value), and the downsampling that keeps
it bounded. Pure: records and text in, points out.

Points come from what a worker reported: each `progress.jsonl` line (a mapping with a `step`;
a nested mapping one level down, `{"val": {"accuracy": 0.8}}`, becomes `val_accuracy`), the
lines of stdout the printed-metrics parser understands (attempts.printed_metrics), and the
final metrics of result.json or the last printed JSON line, placed at the last step reported.
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

MAX_KEY_CHARS = 64
MAX_STEP = 1e15
# What a heartbeat says about the loop itself, not about the model: never a history key.
NOT_HISTORY = frozenset({
    "t", "ts", "time", "step", "global_step", "total", "max_steps", "epoch", "samples_per_s", "peak_mem_mib",
    "eval_batches_done", "eval_batches", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second",
    "train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos",
})


def finite(value: Any) -> float | None:
    """A finite float from a JSON number (bools and huge ints are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > 1e300:
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


def record_points(record: Any) -> list[Point]:
    """The points of one progress.jsonl record: every metric at its `step`; none without one."""
    if not isinstance(record, dict):
        return []
    step = finite(record.get("step"))
    if step is None or not 0 <= step <= MAX_STEP:
        return []
    return [Point(step, key, value) for key, value in flat_metrics(record).items()]


def final_points(metrics: Mapping[str, Any], step: float) -> list[Point]:
    """An attempt's final metrics (result.json's, flattened: `test_accuracy`) at its last step."""
    return [Point(step, key, value) for key, value in flat_metrics(metrics).items()]


@dataclass
class JsonLines:
    """progress.jsonl fed in chunks as it grows: points of each complete line."""

    carry: str = ""
    skip_first: bool = False  # reading started inside the file: its first line is partial

    def feed(self, text: str) -> list[Point]:
        lines = (self.carry + text).split("\n")
        self.carry = lines.pop()[-65536:]  # a line being written (bounded: a line with no end is not JSON)
        if self.skip_first and lines:
            lines.pop(0)
            self.skip_first = False
        points: list[Point] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                record = json.loads(line, parse_constant=lambda token: None)
            except (ValueError, RecursionError):
                continue
            points += record_points(record)
        return points
