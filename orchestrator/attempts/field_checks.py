"""The checks a run-dir record's fields must pass (orchestrator.attempts.rundir_reads): pure
predicates on values parsed from files user code wrote."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

MAX_PID = 4_194_304  # the kernel's pid_max ceiling

Check = Callable[[Any], bool]


def int_in(low: int, high: int) -> Check:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def is_number(v: Any) -> bool:
    # no math.isfinite on an int: a 4000-digit integer overflows the float conversion
    return (
        isinstance(v, int | float)
        and not isinstance(v, bool)
        and not (isinstance(v, float) and not math.isfinite(v))
    )


def number_in(low: float, high: float) -> Check:
    return lambda v: is_number(v) and low <= v <= high


def short_text(limit: int) -> Check:
    return lambda v: isinstance(v, str) and len(v) <= limit


def names_list(v: Any) -> bool:
    return isinstance(v, list) and len(v) <= 16 and all(isinstance(s, str) and len(s) <= 32 for s in v)


def leftovers(v: Any) -> bool:
    """The wrapper's list of processes the worker left running (executors.wrapper.strays)."""
    return isinstance(v, list) and len(v) <= 64 and all(
        isinstance(p, dict) and int_in(1, MAX_PID)(p.get("pid")) and short_text(64)(p.get("name")) for p in v
    )
