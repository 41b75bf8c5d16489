"""Sweeps as grids, and values typed by the configs' own types. Pure: text in, values out.

`--set KEY=VALUE` gives one value; `--grid KEY=V1,V2` (repeatable) several, whose Cartesian
product multiplies the suite's configs × pairs. A value is typed as the configs hold the key:
`learning_rate: 0.0001` makes `1e-4` and `3` floats, `batch_size: 8` makes `16` and `1e1` ints
(a fraction stays a float: `warmup_ratio: 0` takes 0.1), a text key keeps the text as given;
a key only the worker command names (`{cfg.KEY}`) is read as a YAML scalar. A suite file may
carry the same as `grid: {KEY: [V1, V2]}`, and `Sweep.submit` as Python values (`given_grid`,
`given_sets`: a value is one value, never split on commas); `seeds:` (with `tasks:`, or alone
for a script without tasks) stands in for `--pairs`. A grid's size is checked from its value
counts before a combination is built.
Every problem is a PlanError naming the bad value.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from orchestrator.errors import PlanError
from orchestrator.plans.inputs import (
    ENV_NAME_RE,
    MAX_SEED,
    PAIR_KEYS,
    SUITE_KEYS,
    Pair,
    Scalar,
    check_env_name,
    check_task_name,
    check_text,
    parse_scalar,
    parse_seeds,
    shown_repr,
    shown_value,
)
from orchestrator.plans.model import ConfigSpec
from orchestrator.plans.spelling import did_you_mean

MAX_GRID_JOBS = 100_000  # configs × grid × pairs beyond this is a typo, not a sweep
MAX_GRID_VALUES = 1000


def config_type(key: str, configs: Iterable[ConfigSpec]) -> type | None:
    """The type the configs give `key` (int and float together: float); None when no config
    holds a scalar there or they disagree."""
    kinds = {type(c.content[key]) for c in configs if c.content.get(key) is not None}
    if kinds and kinds <= {int, float}:
        return float if float in kinds else int
    if len(kinds) == 1 and (kind := next(iter(kinds))) in (str, bool):
        return kind
    return None


def typed_value(flag: str, key: str, raw: str, kind: type | None) -> Scalar:
    """`raw` as the configs' type of `key` (`kind`), else as a YAML scalar."""
    check_text(f"{flag} {key}", raw)
    text = raw.strip()
    if kind is str:
        return raw
    if kind is None:
        return parse_scalar(key, raw)
    if kind is bool:
        value = parse_scalar(key, raw)
        if not isinstance(value, bool):
            raise PlanError(f"{flag} {key}={shown_value(raw)}: {key} is true or false in the config")
        return value
    try:
        number = float(text)
    except ValueError:
        raise PlanError(f"{flag} {key}={shown_value(raw)}: not a number, and {key} is a number in the config") from None
    if not math.isfinite(number):
        raise PlanError(f"{flag} {key}={shown_value(raw)}: value must be a finite number")
    if kind is int and number.is_integer():
        if abs(number) > 2**53:
            raise PlanError(f"{flag} {key}={shown_value(raw)}: number is too large")
        return int(number)
    return number  # a fraction where the config wrote a whole number (`warmup_ratio: 0`) widens to a float


def _split_item(flag: str, item: str, known: set[str]) -> tuple[str, str]:
    check_text(flag, item)
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise PlanError(f"{flag} {shown_value(item)} is not KEY=VALUE")
    check_key(flag, key, known)
    return key, raw


def check_key(flag: str, key: str, known: set[str]) -> None:
    """A key `flag` may set: a config key the suite knows, or env.NAME; never seed or data."""
    check_text(f"{flag} key", key, 128)
    if key.startswith("env."):
        if not ENV_NAME_RE.fullmatch(key[len("env."):]):
            raise PlanError(
                f"{flag} {shown_value(key)}: {shown_value(key[4:])} is not a valid environment variable name"
            )
        check_env_name(f"{flag} {key}", key[len("env."):])
    elif key in PAIR_KEYS:
        raise PlanError(
            f"{flag} {key}=... is not allowed: seed and data come from --pairs (or the suite's seeds: and tasks:)"
        )
    elif key not in known and key in SUITE_KEYS:
        # not a key of any config: `add it to your config file` would send it where it is refused
        raise PlanError(f"{flag} {shown_value(key)}: {key} is a suite key, not a config key: "
                        f"set `{key}:` in the suite file")
    elif key not in known:
        keys = ", ".join(sorted(known))
        raise PlanError(f"{flag} {shown_value(key)}: unknown config key{did_you_mean([key], known)} "
                        f"(the configs' keys: {keys}); "
                        f"add `{key}:` to your config file to set it")


def _looks_like_a_list(raw: str, kind: type | None) -> bool:
    """A comma list meant as several values: any comma in a number or switch, or pieces that
    are each a number or a switch (a text key may hold commas: `target_modules=q_proj,v_proj`)."""
    if "," not in raw:
        return False
    if kind in (int, float, bool):
        return True
    if kind is str:
        return False
    try:
        return all(isinstance(parse_scalar("", piece), (int, float, bool)) for piece in raw.split(","))
    except PlanError:
        return False


def parse_sets(items: Sequence[str], known: set[str], configs: Sequence[ConfigSpec]) -> dict[str, Scalar]:
    """`--set KEY=VALUE`…: one value per key, typed by the configs; a key given twice, or a
    comma list (several values: that is `--grid`), is refused."""
    overrides: dict[str, Scalar] = {}
    for item in items:
        key, raw = _split_item("--set", item, known)
        if key in overrides:
            raise PlanError(f"--set {key} is given twice ({shown_value(item)}): give each key once")
        kind = str if key.startswith("env.") else config_type(key, configs)
        if _looks_like_a_list(raw, kind):
            raise PlanError(f"--set {key}={shown_value(raw)} holds several values: "
                            f"use --grid {key}={raw.strip()} to queue one job per value")
        value = typed_value("--set", key, raw, kind)
        overrides[key] = None if key.startswith("env.") and raw.strip() == "null" else value
    return overrides


def parse_grid(items: Sequence[str], known: set[str], configs: Sequence[ConfigSpec],
               sets: Mapping[str, Scalar] = {}) -> dict[str, list[Scalar]]:
    """`--grid KEY=V1,V2`…: the values of each key, typed by the configs, in the order given."""
    grid: dict[str, list[Scalar]] = {}
    for item in items:
        key, raw = _split_item("--grid", item, known)
        if key in grid:
            raise PlanError(f"--grid {key} is given twice: list every value once, e.g. --grid {key}=V1,V2")
        if key in sets:
            raise PlanError(f"--grid {key} and --set {key} both set {key}: keep one")
        kind = str if key.startswith("env.") else config_type(key, configs)
        pieces = [p for p in raw.split(",")]
        if any(not p.strip() for p in pieces):
            raise PlanError(f"--grid {key}={shown_value(raw)} has an empty value")
        values = [typed_value("--grid", key, p.strip(), kind) for p in pieces]
        grid[key] = _distinct("--grid", key, values)
    return grid


def _distinct(what: str, key: str, values: list[Scalar]) -> list[Scalar]:
    if len(values) > MAX_GRID_VALUES:
        raise PlanError(f"{what} {key}: {len(values)} values, at most {MAX_GRID_VALUES}")
    seen: list[Scalar] = []
    for value in values:
        if any(type(value) is type(s) and value == s for s in seen):
            raise PlanError(f"{what} {key}: value {value!r} is given twice")
        seen.append(value)
    return seen


def given_value(what: str, key: str, value: Any, kind: type | None) -> Scalar:
    """A value given as a YAML or Python scalar (a suite file's `grid:`, `Sweep.submit`): text
    checked as `--set` text is and, for a number or switch key, read as `--set` reads it;
    numbers made the configs' type."""
    if isinstance(value, str):
        check_text(f"{what} {key}", value)
        return typed_value(what, key, value, kind) if kind in (int, float, bool) else value
    if not isinstance(value, (int, float, bool)):
        raise PlanError(f"{what} {key}: {shown_repr(value)} is not one scalar value "
                        "(a number, text, true or false)")
    if isinstance(value, float) and not math.isfinite(value):
        raise PlanError(f"{what} {key}: {value!r} is not a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        raise PlanError(f"{what} {key}: {shown_repr(value)} is too large")
    if kind in (int, float):
        return typed_value(what, key, str(value), kind)
    if kind is str:  # the text `--set KEY=1` gives: both ask for one job, not two
        return _env_text(value)
    if kind is bool and not isinstance(value, bool):
        raise PlanError(f"{what} {key}={value!r}: {key} is true or false in the config")
    return value


def given_grid(what: str, raw: Any, known: set[str], configs: Sequence[ConfigSpec],
               sets: Mapping[str, Scalar] = {}) -> dict[str, list[Scalar]]:
    """A grid given as values, not text: `{KEY: [V1, V2]}` of a suite file or of `Sweep.submit`.
    A value is one value, whatever it holds (a comma, a space)."""
    if not isinstance(raw, Mapping) or not raw:
        raise PlanError(f"{what} must map config keys to lists of values, "
                        "e.g. {learning_rate: [0.0001, 0.0003]}")
    grid: dict[str, list[Scalar]] = {}
    for key, values in raw.items():
        if not isinstance(key, str) or "=" in key or not key.strip():
            raise PlanError(f"{what} key {shown_repr(key)} is not a config key name")
        check_key(what, key, known)
        if key in sets:
            raise PlanError(f"{what} {key} and a set {key} both set {key}: keep one")
        if not isinstance(values, (list, tuple)) or not values:
            raise PlanError(f"{what} {key} must be a non-empty list of values, "
                            f"not {shown_repr(values)}")
        if len(values) > MAX_GRID_VALUES:  # refused before a value is read: 10**7 took 30 s
            raise PlanError(f"{what} {key}: {len(values)} values, at most {MAX_GRID_VALUES}")
        env = key.startswith("env.")
        kind = str if env else config_type(key, configs)
        typed = [given_value(what, key, _env_text(v) if env else v, kind) for v in values]
        grid[key] = _distinct(what, key, typed)
    return grid


def given_sets(what: str, raw: Any, known: set[str],
               configs: Sequence[ConfigSpec]) -> dict[str, Scalar]:
    """One value per key, given as values (`Sweep.submit(sets=...)`); None is YAML's null."""
    if not isinstance(raw, Mapping):
        raise PlanError(f"{what} must map config keys to one value each, "
                        "e.g. {learning_rate: 0.0003}")
    overrides: dict[str, Scalar] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or "=" in key or not key.strip():
            raise PlanError(f"{what} key {shown_repr(key)} is not a config key name")
        check_key(what, key, known)
        kind = str if key.startswith("env.") else config_type(key, configs)
        several = isinstance(value, str) and _looks_like_a_list(value, kind)
        if isinstance(value, (list, tuple)) or several:
            raise PlanError(f"{what} {key} holds several values: use grid={{{key!r}: [...]}} "
                            "to queue one job per value")
        if value is None:
            overrides[key] = None
        elif key.startswith("env."):
            overrides[key] = given_value(what, key, _env_text(value), str)
        else:
            overrides[key] = given_value(what, key, value, kind)
    return overrides


def _env_text(value: Any) -> Any:
    """An environment variable's value as `--set env.NAME=...` would give it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return repr(value) if isinstance(value, float) else str(value)
    return value


def suite_grid(where: str, raw: Any, known: set[str], configs: Sequence[ConfigSpec]) -> dict[str, list[Scalar]]:
    """A suite's `grid: {KEY: [V1, V2]}`: values as YAML wrote them, numbers made the configs' type."""
    if raw is None:
        return {}
    return given_grid(f"{where}: grid", raw, known, configs)


def suite_pairs(where: str, seeds: Any, tasks: Any) -> list[Pair] | None:
    """`seeds:` × `tasks:` of a suite, in file order (seed-major); `seeds:` alone for a script
    that takes no task (its jobs' task is empty); None when it has neither."""
    if seeds is None and tasks is None:
        return None
    if not isinstance(seeds, list) or not seeds:
        raise PlanError(f"{where}: `seeds` must be a non-empty list "
                        "(with `tasks:`, or alone for a script without tasks)")
    if tasks is not None and (not isinstance(tasks, list) or not tasks):
        raise PlanError(f"{where}: `tasks` must be a non-empty list of task names")
    if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_SEED for s in seeds):
        raise PlanError(f"{where}: `seeds` must be non-negative integers")
    for task in tasks or []:
        if not isinstance(task, str):
            raise PlanError(f"{where}: task {task!r} is not a task name")
        check_task_name(f"{where}: task", task)
    for what, items in (("seed", seeds), ("task", tasks or [])):
        seen: set[Any] = set()
        for item in items:
            if item in seen:
                raise PlanError(f"{where}: {what} {item!r} is listed twice")
            seen.add(item)
    return [Pair(seed, task) for seed in seeds for task in (tasks or [""])]


def seed_pairs(text: str, tasks: Sequence[str]) -> list[Pair]:
    """`--seeds 1-3` (or "1 2 3", "1,2,3"): each seed × the suite's tasks, or alone (no task)."""
    seeds = parse_seeds(text)
    return [Pair(seed, task) for seed in seeds for task in (tasks or [""])]


def grid_jobs(grid: Mapping[str, Sequence[Scalar]], configs: int, pairs: int) -> int:
    """How many jobs configs × grid × pairs makes, from the value counts alone (nothing built)."""
    return configs * math.prod(len(values) for values in grid.values()) * pairs


def check_grid_size(what: str, grid: Mapping[str, Sequence[Scalar]], configs: int,
                    pairs: int) -> None:
    """Refuse a sweep over MAX_GRID_JOBS before a combination of it is built."""
    jobs = grid_jobs(grid, configs, pairs)
    if jobs > MAX_GRID_JOBS:
        combos = math.prod(len(values) for values in grid.values())
        raise PlanError(f"{what}: {configs} config(s) × {combos} grid combination(s) × "
                        f"{pairs} pair(s) = {jobs} jobs, more than {MAX_GRID_JOBS}: give fewer values")


def combinations(grid: Mapping[str, Sequence[Scalar]]) -> list[dict[str, Scalar]]:
    """Every assignment of the grid's values, the first key varying slowest; [{}] for no grid."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def merge_grids(suite: Mapping[str, list[Scalar]], given: Mapping[str, list[Scalar]]) -> dict[str, list[Scalar]]:
    """The suite's grid with `--grid` replacing the keys it names."""
    return {**suite, **given}
