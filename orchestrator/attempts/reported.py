"""What an ended attempt reported for the results tables, read once at its end and stored with it
(attempts.reported_json): its test and val metrics, whether its "test" split is the validation
split, the LoRA dropout and the step that chose its weights, and a failed run's error. Pure.

The tables then never reopen run dirs (which may sit on a slow shared filesystem, or be gone).
result.json is written by user code: anything but a mapping of numbers under metrics.test is
counted as missing, never trusted. A progress line's bookkeeping (`step`, `epoch`, ...) is never
a result metric."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from orchestrator.attempts.printed_metrics import BOOKKEEPING_KEYS
from orchestrator.wording import number

MAX_ERROR_CHARS = 200  # a failed seed's error, as a results note shows it
READING_VERSION = 1  # the stored shape; a later one may add keys, never change these


@dataclass(frozen=True)
class RunReading:
    """What one attempt reported: its finite test metrics (None when it has none), whether its
    "test" split is the validation split, the LoRA dropout it ran with (None when its
    result.json does not say), its val metrics, the step that chose its weights, and the first
    line of the error its result.json gives ("" without one)."""

    metrics: dict[str, float] | None
    test_is_val: bool = False
    lora_dropout: float | None = None
    val_metrics: dict[str, float] = field(default_factory=dict)
    best_step: int | None = None
    error: str = ""

    def to_record(self) -> dict[str, Any]:
        return {
            "version": READING_VERSION,
            "test": self.metrics,
            "val": self.val_metrics,
            "test_is_val": self.test_is_val,
            "lora_dropout": self.lora_dropout,
            "best_step": self.best_step,
            "error": self.error,
        }


def reading_of(result: dict[str, Any] | None, printed: str | dict[str, Any] | None) -> RunReading:
    """The reading of a result.json (validated by attempts.rundir_reads) and the metrics the
    script printed (what a run without result.json reports)."""
    test = job_metrics(result, printed)
    found = result if isinstance(result, dict) else {}
    best_step = found.get("best_step")
    error = found.get("error")
    return RunReading(
        None if test is None else finite_metrics(test),
        found.get("test_is_val") is True,
        number(found.get("lora_dropout")),
        val_metrics(result),
        best_step if isinstance(best_step, int) and not isinstance(best_step, bool) else None,
        first_line(error) if isinstance(error, str) else "",
    )


def reading_from_record(text: str | None) -> RunReading | None:
    """A stored reading (attempts.reported_json); None when none was stored (an attempt that
    ended before readings were) or the text is not one."""
    if not text:
        return None
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("version") != READING_VERSION:
        return None
    test, val = record.get("test"), record.get("val")
    dropout, best_step, error = (
        record.get("lora_dropout"),
        record.get("best_step"),
        record.get("error"),
    )
    return RunReading(
        finite_metrics(test) if isinstance(test, dict) else None,
        record.get("test_is_val") is True,
        number(dropout) if dropout is not None else None,
        finite_metrics(val) if isinstance(val, dict) else {},
        best_step if isinstance(best_step, int) and not isinstance(best_step, bool) else None,
        error if isinstance(error, str) else "",
    )


def first_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """The first non-blank line of an error written by user code, without control characters
    (an ANSI escape would reach the terminal) and cut at `limit`."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    line = "".join(ch if ch.isprintable() else " " for ch in line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def val_metrics(result: dict[str, Any] | None) -> dict[str, float]:
    """The finite metrics a result.json reports on the validation split: `metrics.val`, or the
    `val_X` keys of a flat `metrics` mapping."""
    if not isinstance(result, dict) or not isinstance(result.get("metrics"), dict):
        return {}
    reported = result["metrics"]
    if isinstance(reported.get("val"), dict):
        return finite_metrics(reported["val"])
    flat = {
        key[len("val_") :]: value
        for key, value in reported.items()
        if isinstance(key, str) and key.startswith("val_")
    }
    return finite_metrics(flat)


def job_metrics(
    result: dict[str, Any] | None,
    printed_json: str | dict[str, Any] | None,
    *,
    aliases: bool = True,
) -> dict[str, Any] | None:
    """A job's metrics: result.json's `metrics.test` (or a flat `metrics` of numbers), else what
    its script printed (parsed when the attempt ended); `eval_X` and `test_X` also count as X
    (unless `aliases` is off: the metrics as reported, each once)."""
    metrics: Any = None
    if isinstance(result, dict) and isinstance(result.get("metrics"), dict):
        reported = result["metrics"]
        metrics = reported.get("test") if isinstance(reported.get("test"), dict) else reported
    if not metrics and isinstance(printed_json, dict):
        metrics = printed_json  # parsed already (a typed Attempt's output_metrics)
    elif not metrics and isinstance(printed_json, str) and printed_json:
        with contextlib.suppress(ValueError, RecursionError):
            metrics = json.loads(printed_json)
    if not isinstance(metrics, dict) or not metrics:
        return None
    named = dict(metrics)
    for key, value in metrics.items() if aliases else ():
        for prefix in ("test_", "eval_"):
            if isinstance(key, str) and key.startswith(prefix):
                named.setdefault(key[len(prefix) :], value)
    return named


def finite_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers among a job's metrics (written by user code: NaN, infinities, ints
    too large for a float and non-numbers are left out, never shown or averaged), without a
    training loop's bookkeeping (`step`, `epoch`, `learning_rate`, ...)."""
    kept: dict[str, float] = {}
    for key, value in metrics.items():
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and str(key) not in BOOKKEEPING_KEYS
        ):
            finite = number(value)
            if finite is not None:
                kept[str(key)] = finite
    return kept
