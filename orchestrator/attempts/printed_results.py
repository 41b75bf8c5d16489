"""What a script printed as its results, read from the tail of its log when it wrote no
result.json. Pure: text in, metrics out.

A suite's `result_regex` (named groups, one per metric; the last match wins), else what a
Hugging Face Trainer script prints, JSON or a Python dict (ast.literal_eval of a bounded line,
never eval): the last dict with `eval_*` keys (`trainer.evaluate()`: the validation split) and
the last with `test_*` keys (`trainer.predict(test).metrics`: the test split), merged, without
the Trainer's timings; else the last line that is a JSON object with numbers (`{"accuracy":
0.81}`) and not a progress line (a `step` with only loss, learning rate, epoch and the like).
Which split a key belongs to is results' to say (results.collect): `eval_*` val, `test_*` test.
"""

from __future__ import annotations

import json
import re

from orchestrator.attempts.printed_metrics import (
    BOOKKEEPING_KEYS,
    MAX_DICT_CHARS,
    is_progress_line,
    numeric_entries,
    parse_dict_literal,
    split_segments,
)
from orchestrator.wording import number


def parse_result(tail: str, result_regex: str | None = None) -> dict[str, float] | None:
    """Metrics a script printed at its end: the last `result_regex` match (named groups), else
    what Hugging Face's Trainer prints (JSON or a Python dict): the last dict with `eval_*` keys
    (`trainer.evaluate()`, the validation split) and the last with `test_*` keys
    (`trainer.predict(test).metrics`), merged, without its timings; else the last JSON object
    line with numbers that is not a progress line. None when there is none of these."""
    lines = split_segments(tail)
    if result_regex:
        pattern = re.compile(result_regex)
        for line in reversed(lines):
            match = pattern.search(line)
            if match is None:
                continue
            metrics = {
                k: v for k, raw in match.groupdict().items() if (v := number(raw)) is not None
            }
            if metrics:
                return metrics
    split: dict[str, dict[str, float]] = {}  # prefix -> the last dict's metrics under it
    for line in reversed(lines):
        stripped = line.strip()
        if (
            not (stripped.startswith("{") and stripped.endswith("}"))
            or len(stripped) >= MAX_DICT_CHARS
        ):
            continue
        raw = parse_dict_literal(stripped, nonfinite=True)  # ast.literal_eval of a bounded line, never eval
        printed = numeric_entries(raw, nonfinite=True) if raw is not None else None  # NaN kept: results name it
        if not printed:
            continue
        prefixed = {p: m for p in SPLIT_PREFIXES if (m := _split_metrics(printed, p))}
        if not prefixed:
            # a JSON line of the script's own (a Python dict without eval_/test_ keys is a
            # Trainer log line: progress, not a result)
            if not split and _is_json(stripped) and not is_progress_line(printed):
                return printed
            continue
        if not split:  # the last result line printed: its unprefixed metrics are the test split's
            plain = {
                key: value
                for key, value in printed.items()
                if not key.startswith(SPLIT_PREFIXES) and key not in BOOKKEEPING_KEYS
            }
            if plain:
                split[""] = plain
        for prefix, metrics in prefixed.items():
            split.setdefault(prefix, metrics)
        if all(prefix in split for prefix in SPLIT_PREFIXES):
            break
    merged = {key: value for metrics in split.values() for key, value in metrics.items()}
    return merged or None


# What a Trainer prints its evaluations under: `eval_*` (the validation split) and `test_*`.
SPLIT_PREFIXES = ("eval_", "test_")
# A Trainer's timings beside its metrics (`eval_runtime`, ...): never a result metric.
_RUN_STATS = frozenset(
    {"runtime", "samples_per_second", "steps_per_second", "model_preparation_time"}
)


def _split_metrics(printed: dict[str, float], prefix: str) -> dict[str, float]:
    return {
        key: value
        for key, value in printed.items()
        if key.startswith(prefix)
        and len(key) > len(prefix)
        and key[len(prefix) :] not in _RUN_STATS
    }


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
