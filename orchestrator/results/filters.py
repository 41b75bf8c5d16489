"""`orch results --where KEY=VALUE`: keep the runs whose effective setting has that value. Pure.

KEY is `suite`, `config`, `task` (or `data`), or a key of the effective config (the config with
its `--set` overrides, `env.NAME` for an env override). VALUE compares as a number when both
sides are numbers (`learning_rate=1e-3` matches 0.001), as true/false for a boolean, else as
text. A filter keeps or drops whole settings, never some seeds of one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.results.aggregate import ResultRow
from orchestrator.wording import fmt_value

NAMED_KEYS = ("suite", "config", "task", "data")
MAX_KEYS_LISTED = 12


@dataclass(frozen=True)
class Where:
    key: str
    value: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


def parse_where(texts: Sequence[str]) -> list[Where]:
    """`["learning_rate=1e-3"]` -> [Where("learning_rate", "1e-3")]; UsageError names a bad one."""
    out = []
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--where {text!r}: expected KEY=VALUE, e.g. --where learning_rate=1e-3")
        out.append(Where(key.strip(), value.strip()))
    return out


def _value_of(row: ResultRow, key: str) -> tuple[bool, Any]:
    if key == "suite":
        return True, row.suite
    if key == "config":
        return True, row.config
    if key in ("task", "data"):
        return True, row.task
    if key in row.params:
        return True, row.params[key]
    return False, None


def value_matches(actual: Any, wanted: str) -> bool:
    """Whether a setting's value reads as `wanted` (numbers as numbers, booleans as true/false)."""
    if isinstance(actual, bool):
        return wanted.lower() == ("true" if actual else "false")
    if isinstance(actual, (int, float)):
        try:
            number = float(wanted)
        except ValueError:
            return False
        return math.isclose(float(actual), number, rel_tol=1e-12, abs_tol=0.0) or float(actual) == number
    if actual is None:
        return wanted.lower() in ("null", "none", "~", "")
    return str(actual) == wanted or fmt_value(actual) == wanted


def apply_where(rows: Iterable[ResultRow], filters: Sequence[Where]) -> list[ResultRow]:
    """The rows every filter keeps. UsageError for a key no run's setting has."""
    kept = list(rows)
    for where in filters:
        known = [row for row in kept if _value_of(row, where.key)[0]]
        if kept and not known:
            keys = sorted({*NAMED_KEYS, *(k for row in kept for k in row.params)})
            listed = ", ".join(keys[:MAX_KEYS_LISTED]) + (", ..." if len(keys) > MAX_KEYS_LISTED else "")
            raise UsageError(f"--where {where}: no run has a setting {where.key!r} (settings: {listed})")
        kept = [row for row in known if value_matches(_value_of(row, where.key)[1], where.value)]
    return kept
