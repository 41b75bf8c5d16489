"""What an ended attempt reported for the results tables, read once at its end and stored with it
(attempts.reported_json): its test and val metrics, whether its "test" split is the validation
split, the LoRA dropout and the step that chose its weights, and a failed run's error. Pure.

The tables then never reopen run dirs (which may sit on a slow shared filesystem, or be gone).
result.json is written by user code: anything but a mapping of numbers under metrics.test is
counted as missing, never trusted. A metric whose value is a number but not a finite one (NaN, an
infinity, an integer too large for a float) or one beyond wording.MAX_METRIC (1e300) is missing
too, and named (`nonfinite_test`, `nonfinite_val`), so a table can say which; the run's other
metrics still count. A progress line's bookkeeping (`step`, `epoch`, ...) is never a result
metric."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.attempts.fused_lessons import MAX_MEMBERS, reported_group_size
from orchestrator.attempts.printed_metrics import BOOKKEEPING_KEYS
from orchestrator.plans.model import ShareBase
from orchestrator.wording import MAX_METRIC, number

MAX_ERROR_CHARS = 200  # a failed seed's error, as a results note shows it
MAX_NONFINITE = 32  # non-finite metrics named per split (a result.json may hold thousands)
MAX_METRIC_NAME = 200  # longer names are not named as non-finite
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
    printed_splits: bool = False  # printed eval_*/test_* names were read as val and test
    # `share_base: fused`: the largest group it trained in (its `fused_members_max`; 0: not said);
    # None: not trained in a fused process
    fused_members: int | None = None
    # metrics whose value was a number but not a finite one: name -> what it was (`nan`, `inf`)
    nonfinite_test: dict[str, str] = field(default_factory=dict)
    nonfinite_val: dict[str, str] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        return {
            "version": READING_VERSION,
            "test": self.metrics,
            "val": self.val_metrics,
            "test_is_val": self.test_is_val,
            "lora_dropout": self.lora_dropout,
            "best_step": self.best_step,
            "error": self.error,
            "printed_splits": self.printed_splits,
            "fused_members": self.fused_members,
            "nonfinite": {"test": self.nonfinite_test, "val": self.nonfinite_val},
        }


def reading_of(result: dict[str, Any] | None, printed: str | dict[str, Any] | None) -> RunReading:
    """The reading of a result.json (validated by attempts.rundir_reads) and the metrics the
    script printed (what a run without result.json reports)."""
    test = job_metrics(result, printed)
    val = _val_reported(result, printed)
    found = result if isinstance(result, dict) else {}
    best_step = found.get("best_step")
    error = found.get("error")
    return RunReading(
        None if test is None else finite_metrics(test),
        found.get("test_is_val") is True,
        number(found.get("lora_dropout")),
        finite_metrics(val),
        best_step if isinstance(best_step, int) and not isinstance(best_step, bool) else None,
        first_line(error) if isinstance(error, str) else "",
        printed_splits(result, printed),
        fused_of(found),
        nonfinite_metrics(test or {}),
        nonfinite_metrics(val),
    )


def fused_of(result: dict[str, Any]) -> int | None:
    """A result.json saying `share_base: fused`: the largest group it trained in (1..16; 0 where
    it does not say); None for any other."""
    if result.get("share_base") != ShareBase.FUSED.value:
        return None
    return reported_group_size(result) or 0


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
    nonfinite = record.get("nonfinite")  # absent from readings stored before it was
    nonfinite = nonfinite if isinstance(nonfinite, dict) else {}
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
        record.get("printed_splits") is True,
        _fused_record(record.get("fused_members")),
        _nonfinite_record(nonfinite.get("test")),
        _nonfinite_record(nonfinite.get("val")),
    )


def _nonfinite_record(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    kept = {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_METRIC_NAME}
    return dict(list(kept.items())[:MAX_NONFINITE])


def _fused_record(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_MEMBERS else None


def first_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """The first non-blank line of an error written by user code, without control characters
    (an ANSI escape would reach the terminal) and cut at `limit`."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    line = "".join(ch if ch.isprintable() else " " for ch in line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def val_metrics(result: dict[str, Any] | None, printed_json: str | dict[str, Any] | None = None) -> dict[str, float]:
    """The finite metrics a run reports on the validation split: result.json's `metrics.val`,
    or the `val_X` and `eval_X` keys of a flat `metrics` mapping, else the `eval_X` keys its
    script printed (a Trainer's `evaluate()`)."""
    return finite_metrics(_val_reported(result, printed_json))


def _val_reported(result: dict[str, Any] | None, printed_json: str | dict[str, Any] | None) -> dict[str, Any]:
    """The validation split's metrics as reported, before any is checked (val_metrics)."""
    if isinstance(result, dict) and isinstance(result.get("metrics"), dict) and result["metrics"]:
        reported = result["metrics"]
        if isinstance(reported.get("val"), dict):
            return dict(reported["val"])
        if isinstance(reported.get("test"), dict):
            return {}
        return _split_flat(reported)[1]
    printed = _printed(printed_json)
    return _split_flat(printed)[1] if printed else {}


def job_metrics(result: dict[str, Any] | None, printed_json: str | dict[str, Any] | None, *,
                aliases: bool = True) -> dict[str, Any] | None:
    """A job's test metrics: result.json's `metrics.test` (or a flat `metrics` of numbers), else
    what its script printed (parsed when the attempt ended). In a flat mapping `test_X` is the
    test split's X and `eval_X` the validation split's (val_metrics), each counted once (unless
    `aliases` is off: the metrics as reported, each once)."""
    metrics: Any = None
    nested = False
    if isinstance(result, dict) and isinstance(result.get("metrics"), dict):
        reported = result["metrics"]
        nested = isinstance(reported.get("test"), dict)
        metrics = reported["test"] if nested else reported
    if not metrics:
        nested = False
        metrics = _printed(printed_json)
    if not isinstance(metrics, dict) or not metrics:
        return None
    if not aliases:
        return dict(metrics)
    if nested:  # the test split by name: a prefix only repeats it
        return {_unprefixed(key, metrics): value for key, value in metrics.items()}
    return _split_flat(metrics)[0] or None


def printed_splits(result: dict[str, Any] | None, printed_json: str | dict[str, Any] | None) -> bool:
    """Whether the run's numbers are printed metrics whose `eval_*`/`test_*` names were read as
    the val and test splits (the results header then says so)."""
    return job_metrics(result, None) is None and any(
        str(key).startswith(("eval_", "test_")) for key in _printed(printed_json) or {}
    )


def _printed(printed_json: str | dict[str, Any] | None) -> dict[str, Any] | None:
    if isinstance(printed_json, dict):
        return printed_json  # parsed already (a typed Attempt's output_metrics)
    if isinstance(printed_json, str) and printed_json:
        with contextlib.suppress(ValueError, RecursionError):
            parsed = json.loads(printed_json)
            return parsed if isinstance(parsed, dict) else None
    return None


def _unprefixed(key: Any, metrics: dict[str, Any]) -> Any:
    """`test_X` or `eval_X` as X where X is not reported itself."""
    for prefix in ("test_", "eval_"):
        if isinstance(key, str) and key.startswith(prefix) and key[len(prefix):] and key[len(prefix):] not in metrics:
            return key[len(prefix):]
    return key


PRINTED_SPLITS_NOTE = ("printed metrics: eval_* are read as the validation split (val), test_* as the test "
                       "split (Hugging Face Trainer's evaluate() and predict())")


def _split_flat(metrics: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(test, val) of a flat mapping: `eval_X` and `val_X` are the validation split's X, `test_X`
    the test split's, any other key the test split's as it is."""
    test: dict[str, Any] = {}
    val: dict[str, Any] = {}
    for key, value in metrics.items():
        name = str(key)
        if name.startswith(("eval_", "val_")) and not name.endswith("_"):
            val.setdefault(name.split("_", 1)[1], value)
        elif name.startswith("test_") and len(name) > len("test_"):
            test[name[len("test_"):]] = value
        else:
            test.setdefault(name, value)
    return test, val


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
            finite = metric_number(value)
            if finite is not None:
                kept[str(key)] = finite
    return kept


def metric_number(value: Any) -> float | None:
    """A value a metric can have: a finite number of magnitude at most wording.MAX_METRIC."""
    found = number(value)
    return found if found is not None and abs(found) <= MAX_METRIC else None


def nonfinite_metrics(metrics: dict[str, Any]) -> dict[str, str]:
    """The metrics finite_metrics leaves out for being numbers that are not finite ones or are
    beyond wording.MAX_METRIC: name -> `nan`, `inf`, `-inf`, the value (`1e+305`) or `too large`
    (an integer no float holds); at most MAX_NONFINITE, names up to MAX_METRIC_NAME characters.
    Strings, mappings and lists are not numbers: not named."""
    named: dict[str, str] = {}
    for key, value in metrics.items():
        if len(named) >= MAX_NONFINITE:
            break
        name = str(key)
        if (not isinstance(value, (int, float)) or isinstance(value, bool) or name in BOOKKEEPING_KEYS
                or len(name) > MAX_METRIC_NAME or metric_number(value) is not None):
            continue
        found = number(value)
        named[name] = (repr(found) if found is not None  # beyond MAX_METRIC, each digit it has (1.0000001e+300)
                       else "too large" if isinstance(value, int) else repr(value))  # nan, inf, -inf
    return named


NONFINITE_VALUES = frozenset({"nan", "inf", "-inf"})


def nonfinite_said(split: str, metric: str, value: str) -> str:
    """`a non-finite test accuracy (nan)`, `a test loss too large to average (1e+305)`: how every
    view (results notes, the per-run lines, the web job page) names a metric left out for not
    being finite or being beyond wording.MAX_METRIC (`value` as nonfinite_metrics gives it)."""
    if value in NONFINITE_VALUES:
        return f"a non-finite {split} {metric} ({value})"
    return f"a {split} {metric} too large to average" + ("" if value == "too large" else f" ({value})")


def missing_said(metric: str, nonfinite: Mapping[str, str], no_metrics: str | None, has_metrics: bool) -> str:
    """What a succeeded run reported instead of a test value of `metric`, said after `reported`
    by every view: the metric and its value where it was a number but not a finite one
    (nonfinite_said), else why the run has no metrics (`no_metrics`), else `no finite metric`
    (it reported none that is a finite number) or `no accuracy` (it reported others)."""
    if metric in nonfinite:
        return nonfinite_said("test", metric, nonfinite[metric])
    return no_metrics or ("no finite metric" if not has_metrics else f"no {metric}")
