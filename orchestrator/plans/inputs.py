"""Parsing of what a user types: `--gpus`, `--gpu-plan`, `--pairs`, `--round` and `--set`.

Pure functions: they take strings and return values (no I/O). Every bad value raises PlanError
(exit 2) with one line naming it. The text checks here are shared with suite loading.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import yaml

from orchestrator.errors import PlanError
from orchestrator.plans.spelling import did_you_mean

DEFAULT_SLOTS = 1  # a GPU the plan does not name runs one job at a time
MAX_SLOTS_PER_GPU = 64
MAX_GPU_INDEX = 1023
MAX_SEED = 2**31 - 1
MAX_VALUE_CHARS = 4096
MAX_PAIRS_CHARS = 65536  # a long sweep's pair list is longer than one value

PAIR_KEYS = frozenset({"seed", "data"})  # set per job from --pairs, never by --set
# the keys of a suite file (plans/suites/NAME.yaml); a config key is anything its worker reads
SUITE_KEYS = frozenset({
    "name", "description", "worker", "mem_gib", "env", "configs", "config_dir", "rounds",
    "one_token_tasks", "ladder", "max_attempts", "max_resumes", "hang_timeout_s", "crash_loop",
    "notify",
    "keys", "progress_regex", "result_regex", "fail_on_divergence", "divergence_factor",
    "memory_keys", "min_stack_gain", "slurm",
    "gpus", "cpus", "grid", "seeds", "tasks", "not_science", "early_stop", "search",
    "share_base", "fused_members",
})

SUITE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_DATA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Set by orch per attempt to the cards it was placed on: a suite's value would run the job on
# cards given to other jobs (`gpus:`/`--gpus` choose cards).
PLACEMENT_ENV_NAMES = frozenset({"CUDA_VISIBLE_DEVICES", "ORCH_GPU_UUID", "ORCH_GPU_INDEX"})


def check_env_name(what: str, name: str) -> None:
    """An environment variable a suite may set: a valid name, none orch sets for placement."""
    if name in PLACEMENT_ENV_NAMES:
        raise PlanError(f"{what}: {name} is set by orch to the GPUs each attempt is placed on; "
                        "choose cards with `gpus:` or --gpus")
_EXPONENT_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+")
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

Scalar = str | int | float | bool | None


def shown_value(text: str, limit: int = 60) -> str:
    """A bad value quoted for an error line: printable and short."""
    shown = text if len(text) <= limit else text[:limit] + "…"
    return ascii(shown) if _CONTROL_CHARS.search(shown) else repr(shown)


def shown_repr(value: object, limit: int = 60) -> str:
    """A bad Python value (not text a user typed) for an error line: its repr, short. Never
    raises: an int too long to print, a self-holding list or a failing __repr__ is named by type."""
    if isinstance(value, int) and value.bit_length() > 256:
        return f"a whole number of {value.bit_length()} bits"
    try:
        shown = repr(value)
    except Exception:  # ValueError (int digits), RecursionError, a __repr__ of its own
        return f"a {type(value).__name__} value"
    return shown if len(shown) <= limit else shown[:limit] + "…"


def shown_typed(value: object) -> str:
    """A bad value of a YAML file for an error line: text quoted as `shown_value` quotes it, a
    number or boolean as itself (`'3'` is a string, `3` is not)."""
    return shown_value(value) if isinstance(value, str) else shown_repr(value)


def yaml_number(value: object) -> object:
    """A number YAML left as text (`5e-1` and `1e3` are strings to YAML 1.1, which wants a dot
    and a signed exponent): the number; any other value as it is."""
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return value
    return value


def check_text(what: str, text: str, max_chars: int = MAX_VALUE_CHARS) -> None:
    if _CONTROL_CHARS.search(text) or "\n" in text:
        raise PlanError(f"{what} contains control characters: {shown_value(text)}")
    if len(text) > max_chars:
        raise PlanError(f"{what} is too long ({len(text)} characters, at most {max_chars})")


def _parse_nonneg_int(what: str, token: str, maximum: int) -> int:
    if not re.fullmatch(r"[0-9]+", token):
        raise PlanError(f"{what} {shown_value(token)} is not a non-negative integer")
    if len(token) > 12 or int(token) > maximum:
        raise PlanError(f"{what} {shown_value(token)} is too large (at most {maximum})")
    return int(token)


def _tokens(text: str) -> list[str]:
    """Split on commas and/or whitespace, as the bash launchers accepted."""
    return [t for t in re.split(r"[,\s]+", text.strip()) if t]


# ---------------------------------------------------------------- GPUs and plans


def parse_gpus(text: str) -> list[int]:
    """`--gpus "0 1 2"` (or "0,1,2"): physical GPU indices in the order given."""
    check_text("--gpus", text)
    tokens = _tokens(text)
    if not tokens:
        raise PlanError("--gpus is empty: give GPU indices such as \"0 1 2\"")
    indices = [_parse_nonneg_int("GPU index", t, MAX_GPU_INDEX) for t in tokens]
    seen: set[int] = set()
    for index in indices:
        if index in seen:
            raise PlanError(f"--gpus names GPU {index} twice")
        seen.add(index)
    return indices


@dataclass(frozen=True)
class GpuPlan:
    """Per-GPU concurrency caps. `default_slots` applies to GPUs the plan does not name."""

    slots_by_gpu: dict[int, int] = field(default_factory=dict)
    default_slots: int | None = None

    def slots_for(self, gpu_index: int, fallback: int) -> int:
        if gpu_index in self.slots_by_gpu:
            return self.slots_by_gpu[gpu_index]
        return self.default_slots if self.default_slots is not None else fallback

    def total_slots(self, gpu_indices: Iterable[int], fallback: int) -> int:
        return sum(self.slots_for(i, fallback) for i in gpu_indices)


def parse_gpu_plan(
    text: str, gpus: Sequence[int] | None, what: str = "--gpu-plan", *, allow_all_zero: bool = False
) -> GpuPlan:
    """`--gpu-plan "2,2,1"`: one cap per GPU of `--gpus` (or GPUs 0..n-1 without it).

    A single integer is broadcast (to `--gpus`, or to every GPU when `--gpus` is absent);
    `0` keeps a GPU visible but unused; any other length mismatch is an error. A plan of
    only zeros is refused (nothing could run) unless `allow_all_zero`: `orch plan set 0 --gpus 3`
    takes GPU 3 out of use while the GPUs the plan does not name keep running.
    """
    check_text(what, text)
    tokens = _tokens(text)
    if not tokens:
        raise PlanError(f"{what} is empty: give one number per GPU such as \"2,2,1\"")
    if "," in text and any(not piece.strip() for piece in text.strip().split(",")):
        raise PlanError(f"{what} {shown_value(text)} has an empty entry: give one number per GPU such as \"2,2,1\"")
    caps = [_parse_nonneg_int("GPU plan entry", t, MAX_SLOTS_PER_GPU) for t in tokens]
    if not any(caps) and not allow_all_zero:
        raise PlanError(f"{what} {shown_value(text)} gives every GPU 0 slots: nothing could ever run")
    if len(caps) == 1:
        if gpus is None:
            return GpuPlan(default_slots=caps[0])
        return GpuPlan(slots_by_gpu={g: caps[0] for g in gpus})
    targets = list(gpus) if gpus is not None else list(range(len(caps)))
    if len(caps) != len(targets):
        raise PlanError(
            f"{what} has {len(caps)} entries but --gpus names {len(targets)} GPUs "
            f"({' '.join(map(str, targets))}): give one entry per GPU or a single number"
        )
    return GpuPlan(slots_by_gpu=dict(zip(targets, caps, strict=True)))


# ---------------------------------------------------------------- pairs and rounds


@dataclass(frozen=True)
class Pair:
    seed: int
    data: str

    def __str__(self) -> str:
        return f"{self.seed}:{self.data}"


def check_task_name(what: str, data: str) -> None:
    if not _DATA_NAME.fullmatch(data):
        raise PlanError(f"{what} {shown_value(data)} is not a task name "
                        "(letters, digits, '_', '-', '.'; e.g. glue-tvt_qnli)")


def parse_pairs(text: str) -> list[Pair]:
    """`--pairs "87:glue-tvt_qnli 127:glue-tvt_rte"` (comma- or space-separated SEED:DATA)."""
    check_text("--pairs", text, MAX_PAIRS_CHARS)
    tokens = _tokens(text)
    if not tokens:
        raise PlanError('--pairs is empty: give SEED:DATA pairs such as "87:glue-tvt_qnli"')
    pairs: list[Pair] = []
    seen: set[Pair] = set()
    for token in tokens:
        seed_text, sep, data = token.partition(":")
        if not sep:
            raise PlanError(f"pair {shown_value(token)} is not SEED:DATA (e.g. 87:glue-tvt_qnli)")
        seed = _parse_nonneg_int(f"seed in pair {shown_value(token)}:", seed_text, MAX_SEED)
        check_task_name(f"pair {shown_value(token)}: data name", data)
        pair = Pair(seed, data)
        if pair in seen:
            raise PlanError(f"pair {pair} is given twice")
        seen.add(pair)
        pairs.append(pair)
    return pairs


MAX_SEEDS = 10_000


def parse_seeds(text: str) -> list[int]:
    """`--seeds 1-3` (or "1 2 3", "1,2,3", "1-3 7"): seeds in the order given, each once."""
    check_text("--seeds", text, MAX_PAIRS_CHARS)
    tokens = _tokens(text)
    if not tokens:
        raise PlanError('--seeds is empty: give seeds such as "1-3" or "1 2 3"')
    seeds: list[int] = []
    seen: set[int] = set()
    for token in tokens:
        first, dash, last = token.partition("-")
        low = _parse_nonneg_int("--seeds: seed", first, MAX_SEED)
        high = _parse_nonneg_int("--seeds: seed", last, MAX_SEED) if dash else low
        if high < low:
            raise PlanError(f"--seeds {shown_value(token)}: a range runs from low to high "
                            "(e.g. 1-3)")
        if len(seeds) + high - low + 1 > MAX_SEEDS:
            raise PlanError(f"--seeds {shown_value(text)} names more than {MAX_SEEDS} seeds")
        for seed in range(low, high + 1):
            if seed in seen:
                raise PlanError(f"--seeds names seed {seed} twice")
            seen.add(seed)
            seeds.append(seed)
    return seeds


def parse_round(text: str) -> int | str | None:
    """`--round all` -> None; `--round 3` -> 3 (1-based); `--round NAME` -> a named round."""
    check_text("--round", text)
    token = text.strip()
    if token == "" :
        raise PlanError("--round is empty: give all, a round number (1, 2, ...) or a round name")
    if token.lower() == "all":
        return None
    if re.fullmatch(r"[0-9]+", token):
        number = _parse_nonneg_int("--round", token, 100_000)
        if number < 1:
            raise PlanError("--round numbers start at 1")
        return number
    if not SUITE_NAME_RE.fullmatch(token):
        raise PlanError(f"--round {shown_value(token)} is not all, a number or a round name")
    return token


# ---------------------------------------------------------------- --set overrides


def parse_set_overrides(items: Sequence[str], known_keys: Iterable[str]) -> dict[str, Scalar]:
    """`--set KEY=VALUE`: VALUE is read as a YAML scalar only; KEY is a known key or env.NAME."""
    known = set(known_keys)
    overrides: dict[str, Scalar] = {}
    for item in items:
        check_text("--set", item)
        key, sep, raw_value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise PlanError(f"--set {shown_value(item)} is not KEY=VALUE")
        if key.startswith("env."):
            name = key[len("env."):]
            if not ENV_NAME_RE.fullmatch(name):
                raise PlanError(
                    f"--set {shown_value(key)}: {shown_value(name)} is not a valid environment variable name"
                )
            check_env_name(f"--set {key}", name)
        elif key in PAIR_KEYS:
            raise PlanError(f"--set {key}=... is not allowed: seed and data come from --pairs")
        elif key not in known:
            raise PlanError(f"--set {shown_value(key)}: unknown config key{did_you_mean([key], known)} "
                            f"(known: {', '.join(sorted(known))})")
        overrides[key] = parse_scalar(key, raw_value)
    return overrides


def parse_scalar(key: str, raw_value: str) -> Scalar:
    """A YAML scalar (int, float, bool, null or string); lists, mappings and documents are refused."""
    check_text(f"--set {key}", raw_value)
    try:
        # 4096 characters at most (check_text), and anything but one scalar is refused before it
        # is walked, so aliases cannot blow up here.
        docs = list(yaml.safe_load_all(raw_value))
    except yaml.YAMLError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else "invalid YAML"
        raise PlanError(f"--set {key}={shown_value(raw_value)}: not a YAML scalar ({first_line})") from None
    except (ValueError, TypeError, AttributeError, OverflowError):  # `!!float abc`, `!!int abc`
        raise PlanError(f"--set {key}={shown_value(raw_value)}: not a YAML scalar (its tag cannot "
                        "read the value)") from None
    if len(docs) > 1:
        raise PlanError(f"--set {key}={shown_value(raw_value)}: several YAML documents, give one scalar")
    value = docs[0] if docs else None
    if isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(raw_value.strip()):
        value = float(raw_value)  # YAML 1.1 reads 1e-4 (no dot) as a string; users mean a number
    if not isinstance(value, (str, int, float, bool)) and value is not None:
        raise PlanError(
            f"--set {key}={shown_value(raw_value)}: value must be a scalar, not a {type(value).__name__}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise PlanError(f"--set {key}={shown_value(raw_value)}: value must be a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        raise PlanError(f"--set {key}={shown_value(raw_value)}: number is too large")
    return value

