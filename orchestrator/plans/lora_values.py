"""The LoRA worker's config values that can be checked from the config alone (numbers, flags,
precision, schedule, the data name): what `orch submit` refuses in one line before anything is
written, and what the worker itself refuses at start (workers/lora/config.py, workers/lora/data.py).
No torch, no files: paths (the model folder, a peft JSON file, the data folder) are the worker's
to check where it runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.plans.lora_keys import (
    DEFAULT_CHECKPOINT_EVERY_STEPS,
    LORA_SPEC_KEYS,
    LORA_SPEC_RECORD_KEYS,
    LORA_SPEC_SHORT_KEYS,
    LR_SCHEDULES,
    by_long_names,
)

PRECISIONS = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32"}
# GLUE's classification tasks the worker trains (workers/lora/data.py holds their formats).
GLUE_TASKS = ("cola", "sst2", "mrpc", "qqp", "mnli", "qnli", "rte", "wnli")
REGRESSION_TASKS = ("stsb",)
_DATA_NAME = re.compile(r"^(glue|glue-tvt)_([a-z0-9]+?)(?:_(\d+))?$")


class ConfigError(ValueError):
    """An invalid configuration: reported as status config_error, never retried."""


@dataclass(frozen=True)
class DataName:
    kind: str  # "glue" | "glue-tvt"
    task: str
    subset: int | None


def parse_data_name(name: str) -> DataName:
    """`glue_<task>[_N]` or `glue-tvt_<task>[_N]`; ConfigError naming what is wrong."""
    match = _DATA_NAME.match(name.strip().lower())
    if not match:
        raise ConfigError(f"data name {name!r} is not glue_<task>[_N] or glue-tvt_<task>[_N]")
    kind, task, subset = match.groups()
    if task in REGRESSION_TASKS:
        raise ConfigError(f"task {task!r} is a regression task and is not supported")
    if task not in GLUE_TASKS:
        raise ConfigError(f"unknown task {task!r} in {name!r} (known: {', '.join(GLUE_TASKS)})")
    if subset is not None and int(subset) < 1:
        raise ConfigError(f"subset size in {name!r} must be positive")
    return DataName(kind, task, int(subset) if subset else None)


def check_values(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Every value of a config that needs no file to judge, with the worker's defaults filled in
    (its RunConfig fields, paths aside); ConfigError for the first wrong one."""
    for key in ("model", "data"):
        if key not in raw:
            raise ConfigError(f"config key {key!r} is missing")
    model = raw["model"]
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"config key 'model' must name a built-in model or a model folder, got {model!r}")
    parse_data_name(str(raw["data"]))
    peft = raw.get("peft")
    if peft is not None and not isinstance(peft, dict | str):
        raise ConfigError(
            f"config key 'peft' must be a mapping or a JSON file's path, got {peft!r}"
        )
    resume = raw.get("resume_from_checkpoint")
    if resume not in (None, False, "") and not isinstance(resume, str):
        raise ConfigError(
            f"config key 'resume_from_checkpoint' must be a folder path, got {resume!r}"
        )
    num_epochs = optional(raw, "num_epochs", positive_int)
    max_steps = optional(raw, "max_steps", positive_int)
    return {
        "data": str(raw["data"]),
        "batch_size": positive_int("batch_size", raw.get("batch_size", 8)),
        "learning_rate": positive_float("learning_rate", raw.get("learning_rate", 1e-4)),
        "num_epochs": 1 if num_epochs is None and max_steps is None else num_epochs,
        "max_steps": max_steps,
        "prec": precision(raw),
        "seed": non_negative_int("seed", raw.get("seed", 0)),
        "gradient_accumulation_steps": positive_int(
            "gradient_accumulation_steps", raw.get("gradient_accumulation_steps", 1)
        ),
        "gradient_checkpointing": flag(
            "gradient_checkpointing", raw.get("gradient_checkpointing", False)
        ),
        "logits_to_keep": non_negative_int("logits_to_keep", raw.get("logits_to_keep") or 0),
        "num_data_workers": non_negative_int("num_data_workers", raw.get("num_data_workers", 0)),
        "max_seq_len": positive_int("max_seq_len", raw.get("max_seq_len", 256)),
        "eval_every_steps": optional(raw, "eval_every_steps", positive_int),
        "no_save": flag("no_save", raw.get("no_save", False)),
        "checkpoint_every_steps": non_negative_int(
            "checkpoint_every_steps",
            raw.get("checkpoint_every_steps", DEFAULT_CHECKPOINT_EVERY_STEPS),
        ),
        "eval_batch_size": optional(raw, "eval_batch_size", positive_int),
        **optimizer_settings(raw),
    }


def check_inline_peft(spec: Mapping[str, Any]) -> None:
    """A LoRA spec written in the config (a JSON file's is the worker's to read): every key known
    (a misspelt `lora_alhpa` would train with the default alpha), the rank a positive integer,
    the dropout in [0, 1). At submit only: the worker warns of a key it does not know and trains
    (a job queued before this check must still run)."""
    names = by_long_names(spec)
    allowed = LORA_SPEC_KEYS | LORA_SPEC_RECORD_KEYS
    unknown = sorted(str(k) for k in spec if LORA_SPEC_SHORT_KEYS.get(str(k), str(k)) not in allowed)
    if unknown:
        known = ", ".join(sorted(LORA_SPEC_KEYS | set(LORA_SPEC_SHORT_KEYS)))
        named = ", ".join(repr(k) for k in unknown)
        raise ConfigError(f"unknown LoRA spec key(s) {named} in 'peft' (known: {known})")
    rank = names.get("r", 8)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ConfigError(f"LoRA rank r must be a positive integer, got {rank!r}")
    dropout = names.get("lora_dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise ConfigError(f"lora_dropout must be a number in [0, 1), got {dropout!r}")


def precision(raw: Mapping[str, Any]) -> str:
    prec = str(raw.get("prec", "bf16")).lower()
    if prec not in PRECISIONS:
        raise ConfigError(f"config key 'prec' must be bf16 or fp32, got {raw.get('prec')!r}")
    return PRECISIONS[prec]


def optimizer_settings(raw: Mapping[str, Any]) -> dict[str, Any]:
    schedule = str(raw.get("lr_scheduler") or "constant").lower()
    if schedule not in LR_SCHEDULES:
        raise ConfigError(
            f"config key 'lr_scheduler' must be one of {', '.join(LR_SCHEDULES)}, got {raw['lr_scheduler']!r}"
        )
    warmup_ratio = non_negative_float("warmup_ratio", raw.get("warmup_ratio", 0.0))
    if warmup_ratio > 1:
        raise ConfigError(f"config key 'warmup_ratio' must be at most 1, got {warmup_ratio!r}")
    max_grad_norm = raw.get("max_grad_norm", 1.0)
    if max_grad_norm is None:  # null: no clipping, as 0
        max_grad_norm = 0.0
    return {
        "weight_decay": non_negative_float("weight_decay", raw.get("weight_decay", 0.01)),
        "lr_scheduler": schedule,
        "warmup_steps": non_negative_int("warmup_steps", raw.get("warmup_steps", 0)),
        "warmup_ratio": warmup_ratio,
        "max_grad_norm": non_negative_float("max_grad_norm", max_grad_norm),
    }


def optional(raw: Mapping[str, Any], key: str, check: Callable[[str, Any], int]) -> int | None:
    value = raw.get(key)
    return None if value is None else check(key, value)


def positive_int(key: str, value: Any) -> int:
    number = non_negative_int(key, value)
    if number < 1:
        raise ConfigError(f"config key {key!r} must be a positive integer, got {value!r}")
    return number


def non_negative_int(key: str, value: Any) -> int:
    finite = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    if isinstance(value, bool) or not finite or int(value) != value:
        raise ConfigError(f"config key {key!r} must be an integer, got {value!r}")
    if value < 0:
        raise ConfigError(f"config key {key!r} must not be negative, got {value!r}")
    return int(value)


def positive_float(key: str, value: Any) -> float:
    try:
        number = float(value)  # YAML reads "1e-4" (no dot) as a string
    except (TypeError, ValueError):
        raise ConfigError(f"config key {key!r} must be a number, got {value!r}") from None
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(f"config key {key!r} must be a finite positive number, got {value!r}")
    return number


def non_negative_float(key: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"config key {key!r} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not (math.isfinite(number) and number >= 0):
        raise ConfigError(f"config key {key!r} must be a finite number >= 0, got {value!r}")
    return number


def flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    if value in (0, 1):
        return bool(value)
    raise ConfigError(f"config key {key!r} must be true or false, got {value!r}")
