"""A degradation ladder as a suite writes it: the schema of its steps, parsed and checked.

The ladder's rungs (`Rung`s) say what to change; `orchestrator.prediction.ladder` expands them into the
levels one job runs through and decides retries. The schema is documented at the top of
plans/ladder.yaml.

Each rung is exact (an attempt through it gives bit-equal numbers: checkpointing, whose recompute
restores the RNG state; `logits_to_keep` in the built-in LoRA worker (and the simulator), whose
dropout masks do not depend on it, but not in a researcher's own script, whose dropout may draw
other masks (a rung that changes it is inexact there unless it says `exact: true`); fewer data
workers, the data order being a (seed, epoch) permutation; running alone) or it changes numerics
(half batch × double accumulation: the same effective batch, but another rounding and dropout draw;
a `set:` rung unless it says `exact: true`). The default ladder tries every exact rung before any
inexact one; a strict ladder has exact rungs only.
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
    {"data_workers": 0},
    "run_alone",
    "halve_batch",
]
STRICT = "strict"  # `ladder: strict`: the default ladder's exact rungs only

_ACTIONS = ("checkpointing", "logits_to_keep", "halve_batch", "data_workers", "run_alone", "set")
_INEXACT_ACTIONS = ("halve_batch", "set")  # change numerics unless a `set:` rung says `exact: true`
_FLAG_ACTIONS = ("checkpointing", "halve_batch", "run_alone")  # take `true` only
_BARE_ACTIONS = (*_FLAG_ACTIONS, "logits_to_keep")  # may be written as a bare name
_GUARDED_KEYS = (BATCH_KEY, ACCUM_KEY)  # only halve_batch may change them, keeping the product


@dataclass(frozen=True)
class Rung:
    """One rung as written in a ladder spec."""

    name: str
    checkpointing: bool = False
    logits_to_keep: int | None = None  # applied only to tasks scored on one token
    halve_batch: bool = False  # expands to one level per halving, down to batch_size 1
    data_workers: int | None = None
    run_alone: bool = False
    set_values: tuple[tuple[str, Any], ...] = ()
    exact: bool = True  # an attempt through this rung gives bit-equal numbers
    exact_declared: bool = False  # the rung says `exact:` itself (overrules `logits_exact`)


@dataclass(frozen=True)
class Ladder:
    rungs: tuple[Rung, ...]
    strict: bool = False  # exact rungs only: `expand_levels` leaves the others out


def _step_error(position: int, message: str) -> PlanError:
    return PlanError(f"ladder step {position}: {message}")


def _parse_rung(item: Any, position: int) -> Rung:
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
    unknown = [str(key) for key in item if key not in (*_ACTIONS, "name", "exact")]
    if unknown:
        raise _step_error(
            position, f"unknown action {unknown[0]!r} (known: name, exact, {', '.join(_ACTIONS)})"
        )
    actions = [key for key in item if key not in ("name", "exact")]
    if not actions:
        raise _step_error(position, "a step needs at least one action besides `name` and `exact`")
    exact = _step_exact(item, position)
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
    return Rung(
        name=name,
        checkpointing=bool(item.get("checkpointing", False)),
        logits_to_keep=logits,
        halve_batch=bool(item.get("halve_batch", False)),
        data_workers=workers,
        run_alone=bool(item.get("run_alone", False)),
        set_values=tuple(set_values.items()),
        exact=exact,
        exact_declared=item.get("exact") is not None,
    )


# Workers whose numbers do not depend on `logits_to_keep`: the built-in LoRA worker draws its
# dropout masks independently of it; the simulator has no dropout.
LOGITS_EXACT_WORKERS = frozenset({"lora", "sim"})


def logits_exact(worker: str) -> bool:
    """Whether changing `logits_to_keep` keeps a worker's numbers bit-equal: only for the built-in
    workers; a researcher's own script with dropout may draw other masks."""
    return worker in LOGITS_EXACT_WORKERS


def _step_exact(item: Mapping[str, Any], position: int) -> bool:
    """Whether a rung keeps numbers bit-equal: its own `exact:` where it says, else whether
    every action it takes does. Half batch is never exact (another rounding, another draw)."""
    declared = item.get("exact")
    if declared is not None and not isinstance(declared, bool):
        raise _step_error(position, f"`exact` takes true or false, got {declared!r}")
    if declared is True and "halve_batch" in item:
        raise _step_error(position, "`halve_batch` changes numerics (another rounding and dropout draw): "
                                    "it cannot be declared `exact: true`")
    if declared is not None:
        return declared
    return not any(action in item for action in _INEXACT_ACTIONS)


def load_ladder(spec: Any) -> Ladder:
    """A ladder from a suite's `ladder:` value: a list of steps, `strict` (the default's exact
    rungs only), or a mapping `{strict: true, steps: [...]}` (what `orch submit --strict-ladder`
    stores); None gives the default. Raises PlanError."""
    strict = False
    if spec == STRICT:
        spec, strict = None, True
    elif isinstance(spec, Mapping):
        unknown = [str(key) for key in spec if key not in ("strict", "steps")]
        if unknown or not isinstance(spec.get("strict", False), bool):
            raise PlanError(f"ladder mapping takes `strict: true|false` and `steps: [...]`, got {dict(spec)!r}")
        spec, strict = spec.get("steps"), bool(spec.get("strict", False))
    if spec is None:
        spec = DEFAULT_LADDER_SPEC
    if isinstance(spec, str | bytes) or not isinstance(spec, Sequence):
        shown = repr(spec) if isinstance(spec, str) else type(spec).__name__
        raise PlanError(f"ladder must be a list of steps or {STRICT!r}, got {shown}")
    return Ladder(tuple(_parse_rung(item, position) for position, item in enumerate(spec, 1)), strict)


def strict_spec(spec: Any) -> dict[str, Any]:
    """A suite's ladder value made strict (exact rungs only), as stored with each job."""
    if spec == STRICT:
        spec = None
    elif isinstance(spec, Mapping):
        spec = spec.get("steps")
    return {"strict": True, "steps": spec}


def spec_steps(spec: Any) -> list[Any]:
    """The rungs a suite's ladder value writes (none for the default or `strict`)."""
    if isinstance(spec, Mapping):
        spec = spec.get("steps")
    return list(spec) if isinstance(spec, list) else []


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
