"""The LoRA worker's config keys, and orch's own keys it accepts beside them: what `orch submit`
checks a `lora` config against (orchestrator.plans.worker_output) and what the worker itself
refuses at start (workers/lora/config.py). Plain data, no torch, so orch imports it without the
worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.plans.spelling import did_you_mean

KNOWN_KEYS = frozenset(
    {
        "model", "peft", "data", "data_dir", "batch_size", "learning_rate", "num_epochs",
        "max_steps", "prec", "seed", "gradient_accumulation_steps", "gradient_checkpointing",
        "logits_to_keep", "num_data_workers", "max_seq_len", "eval_every_steps", "no_save",
    }
)  # fmt: skip
# Checkpoints (workers/lora/checkpoint.py): how often, and the one a resumed attempt starts from.
DEFAULT_CHECKPOINT_EVERY_STEPS = 200
RESUME_KEYS = frozenset({"checkpoint_every_steps", "resume_from_checkpoint"})
# The optimizer's keys (and the eval batch); the defaults keep the worker's earlier behaviour (HF Trainer's differ:
# weight_decay 0.0, lr_scheduler linear; warm-up 0 and max_grad_norm 1.0 are the same).
OPTIMIZER_KEYS = frozenset(
    {"weight_decay", "lr_scheduler", "warmup_steps", "warmup_ratio", "max_grad_norm",
     "eval_batch_size"}
)  # fmt: skip
LR_SCHEDULES = ("constant", "linear", "cosine")
TRAINING_KEYS = KNOWN_KEYS | OPTIMIZER_KEYS | RESUME_KEYS
# Keys orch itself reads from or adds to a suite config (memory hints, the job's GPUs, CPU cores
# and host RAM, bookkeeping): not ours, not a mistake.
ORCH_KEYS = frozenset(
    {"mem_gib", "suite", "name", "level", "priority", "gpus", "cpus", "host_mem_gib"}
)
ORCH_KEY_PREFIXES = ("sim_", "orch_")


def unknown_keys(raw: Mapping[str, Any]) -> list[str]:
    """The keys of a config neither the worker nor orch knows, sorted."""
    return sorted(
        str(key) for key in raw
        if key not in TRAINING_KEYS and key not in ORCH_KEYS
        and not str(key).startswith(ORCH_KEY_PREFIXES)
    )  # fmt: skip


def unknown_keys_message(unknown: list[str]) -> str:
    named = ", ".join(repr(key) for key in unknown)
    plural = "s" if len(unknown) > 1 else ""
    return (f"unknown config key{plural} {named}{did_you_mean(unknown, TRAINING_KEYS)} "
            f"(known: {', '.join(sorted(TRAINING_KEYS))})")


# The LoRA spec (`peft:` inline, or a JSON file): peft's LoraConfig keys, the short names the
# plans use for some, and the keys of a saved adapter_config.json that are not settings.
LORA_SPEC_KEYS = frozenset(
    {
        "r", "lora_alpha", "lora_dropout", "target_modules", "use_dora", "use_rslora", "bias",
        "task_type", "layers_to_transform", "layers_pattern", "modules_to_save",
        "init_lora_weights", "fan_in_fan_out", "exclude_modules",
    }
)  # fmt: skip
LORA_SPEC_SHORT_KEYS = {"alpha": "lora_alpha", "dropout": "lora_dropout", "targets": "target_modules", "rank": "r"}
LORA_SPEC_RECORD_KEYS = frozenset({"peft_type", "base_model_name_or_path", "revision", "inference_mode"})


def by_long_names(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A LoRA spec with its short key names (`alpha`, `targets`, ...) written as peft's."""
    return {LORA_SPEC_SHORT_KEYS.get(str(k), str(k)): v for k, v in spec.items()}
