"""`Sweep`'s arguments checked as the CLI's options are: a wrong type is a UsageError of one line
naming the argument, never a value read another way (a string iterated by character, a list
turned into its Python repr). Pure."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.plans.inputs import MAX_SEED, shown_repr

MAX_JOB_ID = 2**63 - 1


def _shown(value: Any) -> str:
    return shown_repr(value)


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be True or False, not {_shown(value)}")
    return value


def path(name: str, value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise UsageError(f"{name} must be a path (a string or pathlib.Path), not {_shown(value)}")
    return Path(value)


def callback(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise UsageError(f"{name} must be a function or None, not {_shown(value)}")
    return value


def text(name: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise UsageError(f"{name} must be a string, not {_shown(value)}")
    return value


def job_ids(name: str, value: Any, *, optional: bool = True) -> list[int] | None:
    """A list (or other iterable) of job ids; `jobs="12"` is refused, never read as 1 and 2."""
    if value is None and optional:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]  # one job, as `orch cancel 3` takes it
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise UsageError(f"{name} must be a list of job ids (e.g. [1, 2]), not {_shown(value)}")
    ids = list(value)
    for job_id in ids:
        if isinstance(job_id, bool) or not isinstance(job_id, int) or not 1 <= job_id <= MAX_JOB_ID:
            raise UsageError(f"{name}: {_shown(job_id)} is not a job id (a positive whole number)")
    return ids


def names(name: str, value: Any) -> list[str] | None:
    """A list of names (metric keys); `keys="loss"` is refused, never read letter by letter."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise UsageError(f"{name} must be a list of names (e.g. ['loss']), not {_shown(value)}")
    listed = list(value)
    for item in listed:
        if not isinstance(item, str):
            raise UsageError(f"{name}: {_shown(item)} is not a name (a string)")
    return listed


def pairs_text(value: Any) -> str | None:
    """`pairs`: "SEED:DATA ..." as `--pairs` takes it, or a list of "SEED:DATA" strings, one
    pair each."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise UsageError(
            f"pairs must be SEED:DATA strings (e.g. ['1:glue_rte']), not {_shown(value)}"
        )
    listed = list(value)
    for pair in listed:
        if not isinstance(pair, str) or not pair.strip() or any(c in pair for c in ", \t"):
            raise UsageError(f"pairs: {_shown(pair)} is not one SEED:DATA pair (e.g. '1:glue_rte')")
    if not listed:
        raise UsageError("pairs is empty: give SEED:DATA pairs such as ['1:glue_rte']")
    return " ".join(listed)


def seeds_text(value: Any) -> str | None:
    """`seeds`: a list of seeds, or text as `--seeds` takes it ("1-3")."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise UsageError(
            f"seeds must be a list of seeds (e.g. [1, 2, 3]) or '1-3', not {_shown(value)}"
        )
    listed = list(value)
    for seed in listed:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise UsageError(f"seeds: {_shown(seed)} is not a seed (a non-negative whole number)")
    if not listed:
        raise UsageError("seeds is empty: give seeds such as [1, 2, 3]")
    return " ".join(map(str, listed))


def number(
    name: str, value: Any, *, optional: bool = False, positive: bool = False
) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise UsageError(f"{name} must be a number, not {_shown(value)}")
    try:
        as_float = float(value)
    except OverflowError:
        as_float = math.inf
    if not math.isfinite(as_float):  # time.sleep(inf) and float(10**400) raise OverflowError
        raise UsageError(f"{name} must be a finite number, not {_shown(value)}")
    if positive and not as_float > 0:
        raise UsageError(f"{name} must be above 0, not {as_float}")
    return as_float
