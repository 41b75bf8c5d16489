"""A degradation ladder as a suite writes it: the schema of its steps, parsed and checked.

The ladder's rungs (`Step`s) say what to change; `orchestrator.prediction.ladder` expands them into the
levels one job runs through and decides retries. The schema is documented at the top of
plans/ladder.yaml.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import PlanError
from orchestrator.yaml_limits import read_yaml_file

BATCH_KEY = "batch_size"
ACCUM_KEY = "gradient_accumulation_steps"
CHECKPOINTING_KEY = "gradient_checkpointing"
LOGITS_KEY = "logits_to_keep"
WORKERS_KEY = "num_data_workers"
EVAL_BATCH_KEY = "eval_batch_size"  # scaled with the batch where a config sets it

# The default ladder, equal to plans/ladder.yaml (a test checks they agree). Kept here too so an
# installed orch without the plans/ directory still has it.
DEFAULT_LADDER_SPEC: list[Any] = [
    {"name": "checkpointing", "checkpointing": True, "logits_to_keep": 1},
    "halve_batch",
    {"data_workers": 0},
    "run_alone",
]

_ACTIONS = ("checkpointing", "logits_to_keep", "halve_batch", "data_workers", "run_alone", "set")
_FLAG_ACTIONS = ("checkpointing", "halve_batch", "run_alone")  # take `true` only
_BARE_ACTIONS = (*_FLAG_ACTIONS, "logits_to_keep")  # may be written as a bare name
_GUARDED_KEYS = (BATCH_KEY, ACCUM_KEY)  # only halve_batch may change them, keeping the product


@dataclass(frozen=True)
class Step:
    """One rung as written in a ladder spec."""

    name: str
    checkpointing: bool = False
    logits_to_keep: int | None = None  # applied only to tasks scored on one token
    halve_batch: bool = False  # expands to one level per halving, down to batch_size 1
    data_workers: int | None = None
    run_alone: bool = False
    set_values: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Ladder:
    steps: tuple[Step, ...]


def _step_error(position: int, message: str) -> PlanError:
    return PlanError(f"ladder step {position}: {message}")


def _parse_step(item: Any, position: int) -> Step:
    if isinstance(item, str):
        if item not in _BARE_ACTIONS:
            raise _step_error(
                position,
                f"{item!r} is not an action that can stand alone "
                f"(use one of {', '.join(_BARE_ACTIONS)}, or a mapping such as {{data_workers: 0}})",
            )
        item = {item: True}
    if not isinstance(item, Mapping) or not item:
        raise _step_error(position, f"expected an action name or a mapping, got {item!r}")
    unknown = [str(key) for key in item if key not in (*_ACTIONS, "name")]
    if unknown:
        raise _step_error(
            position, f"unknown action {unknown[0]!r} (known: name, {', '.join(_ACTIONS)})"
        )
    actions = [key for key in item if key != "name"]
    if not actions:
        raise _step_error(position, "a step needs at least one action besides `name`")
    for flag in _FLAG_ACTIONS:
        if flag in item and item[flag] is not True:
            raise _step_error(position, f"`{flag}` takes only `true`, got {item[flag]!r}")
    if "halve_batch" in item and len(actions) > 1:
        raise _step_error(position, "`halve_batch` repeats, so it must be a step of its own")
    logits = item.get("logits_to_keep")
    if logits is True:
        logits = 1
    if logits is not None and (
        isinstance(logits, bool) or not isinstance(logits, int) or logits < 1
    ):
        raise _step_error(position, f"`logits_to_keep` must be a positive integer, got {logits!r}")
    workers = item.get("data_workers")
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 0
    ):
        raise _step_error(position, f"`data_workers` must be an integer >= 0, got {workers!r}")
    set_values = item.get("set", {})
    if not isinstance(set_values, Mapping) or ("set" in item and not set_values):
        raise _step_error(
            position, f"`set` must be a non-empty mapping of key: value, got {set_values!r}"
        )
    for key, value in set_values.items():
        if not isinstance(key, str) or not key:
            raise _step_error(position, f"`set` keys must be config key names, got {key!r}")
        if key in _GUARDED_KEYS:
            raise _step_error(
                position,
                f"`set` may not change {key!r}: use halve_batch, which keeps batch × accumulation",
            )
        if not (value is None or isinstance(value, str | int | float | bool)):
            raise _step_error(position, f"`set` value for {key!r} must be a scalar, got {value!r}")
    name = item.get("name", "+".join(actions))
    if not isinstance(name, str) or not name.strip():
        raise _step_error(position, f"`name` must be a non-empty string, got {name!r}")
    return Step(
        name=name,
        checkpointing=bool(item.get("checkpointing", False)),
        logits_to_keep=logits,
        halve_batch=bool(item.get("halve_batch", False)),
        data_workers=workers,
        run_alone=bool(item.get("run_alone", False)),
        set_values=tuple(set_values.items()),
    )


def load_ladder(spec: Sequence[Any] | None) -> Ladder:
    """A ladder from a suite's `ladder:` list; None gives the default. Raises PlanError."""
    if spec is None:
        spec = DEFAULT_LADDER_SPEC
    if isinstance(spec, str | bytes) or not isinstance(spec, Sequence):
        raise PlanError(f"ladder must be a list of steps, got {type(spec).__name__}")
    return Ladder(tuple(_parse_step(item, position) for position, item in enumerate(spec, 1)))


def load_ladder_file(path: Path) -> Ladder:
    """Read a ladder file shaped like plans/ladder.yaml (a mapping with a `ladder:` list)."""
    data = read_yaml_file(path, "ladder file")  # size-, alias- and depth-limited
    if not isinstance(data, Mapping) or "ladder" not in data:
        raise PlanError(f"ladder file {path}: expected a mapping with a `ladder:` list")
    try:
        return load_ladder(data["ladder"])
    except PlanError as error:
        raise PlanError(f"ladder file {path}: {error}") from error


def is_one_token_task(task: str, patterns: Sequence[str]) -> bool:
    """Whether a suite marks `task` as scored on one token (fnmatch patterns, e.g. "glue*")."""
    return any(fnmatch.fnmatchcase(task, pattern) for pattern in patterns)
