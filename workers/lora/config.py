"""The worker's YAML config: parsing, validation and path resolution (no torch here).

Keys follow the researchers' existing training scripts so one config file serves both.
An unknown key is an error (a misspelt `warmup_step` must not train without warm-up); orch's
own keys are ignored silently.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# The keys the worker and orch know, and the values orch checks at submit without importing the
# worker (ConfigError is that module's, so both raise the same).
from orchestrator.plans.lora_keys import (
    DEFAULT_CHECKPOINT_EVERY_STEPS,
    unknown_keys,
    unknown_keys_message,
)
from orchestrator.plans.lora_values import ConfigError, check_values

BUILTIN_MODELS = ("tiny-llama", "tiny-gla")
DEFAULT_PEFT: dict[str, Any] = {
    "r": 8,
    "lora_alpha": 16,
    "lora_dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
}


@dataclass(frozen=True)
class RunConfig:
    model: str  # a built-in name or an absolute model directory
    peft: dict[str, Any]
    data: str
    data_dir: Path | None
    batch_size: int = 8
    learning_rate: float = 1e-4
    num_epochs: int | None = None
    max_steps: int | None = None
    prec: str = "bf16"
    seed: int = 0
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = False
    logits_to_keep: int = 0  # 0: logits for every position
    num_data_workers: int = 0
    max_seq_len: int = 256
    eval_every_steps: int | None = None
    no_save: bool = False
    checkpoint_every_steps: int = DEFAULT_CHECKPOINT_EVERY_STEPS  # 0: never
    resume_from_checkpoint: Path | None = None
    weight_decay: float = 0.01  # torch's AdamW default; HF Trainer: 0.0
    lr_scheduler: str = "constant"  # HF Trainer: linear
    warmup_steps: int = 0  # HF Trainer: 0; wins over warmup_ratio when positive
    warmup_ratio: float = 0.0  # HF Trainer: 0.0
    max_grad_norm: float = 1.0  # HF Trainer: 1.0; 0 turns clipping off
    eval_batch_size: int | None = None  # None: 2 x batch_size, so it follows the ladder's halving
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size * self.gradient_accumulation_steps


def load_config(path: Path, env: Mapping[str, str] | None = None) -> RunConfig:
    """Read and validate a config file; raises ConfigError with a one-line reason."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}".splitlines()[0]) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping, got {type(raw).__name__}")
    return parse_config(raw, path.parent, os.environ if env is None else env)


def parse_config(raw: Mapping[str, Any], config_dir: Path, env: Mapping[str, str]) -> RunConfig:
    """Validate a config mapping; relative paths resolve against `config_dir`."""
    unknown = unknown_keys(raw)
    if unknown:
        raise ConfigError(unknown_keys_message(unknown))
    values = check_values(raw)
    warnings: list[str] = []
    peft, peft_warning = resolve_peft(raw.get("peft"), config_dir)
    if peft_warning:
        warnings.append(peft_warning)
    data_dir_value = raw.get("data_dir") or env.get("ORCH_DATA_DIR")
    return RunConfig(
        model=resolve_model(str(raw["model"]), config_dir),
        peft=peft,
        data_dir=_resolve_path(str(data_dir_value), config_dir) if data_dir_value else None,
        resume_from_checkpoint=_resume_path(raw.get("resume_from_checkpoint"), config_dir),
        warnings=tuple(warnings),
        **values,
    )


def resolve_model(value: str, config_dir: Path) -> str:
    """A built-in name, or an existing local model directory (nothing is ever downloaded)."""
    if value in BUILTIN_MODELS:
        return value
    path = _resolve_path(value, config_dir)
    if not path.is_dir():
        raise ConfigError(f"model directory not found: {value} (models are never downloaded)")
    if not (path / "config.json").is_file():
        raise ConfigError(f"model directory {path} has no config.json")
    return str(path)


def resolve_peft(value: Any, config_dir: Path) -> tuple[dict[str, Any], str | None]:
    """The LoRA spec as a mapping: inline, or a JSON file (a path absolute or relative to the
    config's folder: the plans' configs name `../../peft/NAME.json`)."""
    if value is None:
        return dict(DEFAULT_PEFT), "no 'peft' key: using LoRA r=8 on q/k/v/o projections"
    if isinstance(value, dict):
        return dict(value), None
    candidates = [Path(value)] if Path(value).is_absolute() else [config_dir / value]
    for candidate in candidates:
        if candidate.is_file():
            try:
                spec = json.loads(candidate.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"peft spec {candidate} is not valid JSON: {exc}") from None
            if not isinstance(spec, dict):
                raise ConfigError(f"peft spec {candidate} must hold a JSON object")
            return spec, None
    searched = ", ".join(str(c) for c in candidates)
    raise ConfigError(f"peft spec {value!r} not found (looked in: {searched})")


def _resume_path(value: Any, config_dir: Path) -> Path | None:
    """The checkpoint folder to resume from; None or "" (or false): start afresh."""
    if value is None or value is False or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"config key 'resume_from_checkpoint' must be a folder path, got {value!r}")
    return _resolve_path(value, config_dir)


def _resolve_path(value: str, config_dir: Path) -> Path:
    path = Path(value).expanduser()
    if path.is_absolute():
        return path
    # Relative to the working directory first (how users type it), then to the config file.
    return path.resolve() if path.exists() else (config_dir / path).resolve()
