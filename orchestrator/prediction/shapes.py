"""Job shapes: which config keys decide an attempt's GPU memory, and what one shape's peaks say
about its neighbours (other ladder levels, other tasks). Pure: values in, values out.

Two attempts have one shape when they agree on every memory-relevant key of the config the script
receives (after `--set` and the ladder's changes), the model and the task: the ladder level and
the config's name are not part of it. Keys that change only the science or the run time (learning rate, epochs,
eval cadence, seed, the sim worker's run time) are left out, so a `--set learning_rate=...`
keeps what was learned. A suite lists further keys its own script reads (`memory_keys:`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestrator.store.peak_source import PredictionSource, SourceKind

K = TypeVar("K", bound=Hashable)

# Keys that change peak memory in the workers we ship and in the common training scripts.
MEMORY_KEYS: frozenset[str] = frozenset(
    {
        "model", "peft", "prec", "gradient_checkpointing", "logits_to_keep",
        "batch_size", "per_device_train_batch_size", "train_batch_size",
        "max_seq_len", "max_length", "max_seq_length", "seq_len", "block_size",
        "lora_r", "lora_alpha", "lora_dropout", "target_modules",
        # the sim worker's memory model (its run time keys, sim_seconds, sim_ramp_s, sim_startup_s
        # and sim_exit_s, are not)
        "sim_mem_gib", "sim_base_gib", "sim_reference_batch",
    }
)  # fmt: skip
# The sim worker sizes activations by batch / effective batch when sim_reference_batch is unset.
_SIM_ACCUMULATION_KEY = "gradient_accumulation_steps"


# Keys that never change memory, left out of a foreign script's shape. Such a script's memory
# keys are not known (`model_name_or_path`, `bs`, ...), so its shape is every other key: a shape
# split too finely only learns more slowly, while two configs merged into one shape share a peak
# that fits only one of them.
NOT_MEMORY_KEYS: frozenset[str] = frozenset(
    {
        "learning_rate", "lr", "seed", "epochs", "num_train_epochs", "max_steps", "warmup_steps",
        "warmup_ratio", "weight_decay", "lr_scheduler_type", "output_dir", "run_name", "logging_dir",
        "logging_steps", "eval_steps", "save_steps", "eval_every_steps", "save_total_limit",
        "report_to", "overwrite_output_dir", "resume_from_checkpoint", "data", "data_dir",
        "sim_seconds", "sim_ramp_s", "sim_startup_s", "sim_exit_s", "host_mem_gib", "cpus",
    }
)  # fmt: skip


def memory_config(
    config: Mapping[str, Any], extra_keys: Iterable[str] = (), *, foreign: bool = False
) -> dict[str, Any]:
    """The part of `config` that decides memory: MEMORY_KEYS plus the suite's `memory_keys`; for a
    foreign script (`foreign=True`), every key but NOT_MEMORY_KEYS."""
    if foreign:
        return {key: config[key] for key in sorted(config) if key not in NOT_MEMORY_KEYS}
    wanted = set(MEMORY_KEYS) | set(extra_keys)
    if "sim_mem_gib" in config and "sim_reference_batch" not in config:
        wanted.add(_SIM_ACCUMULATION_KEY)
    return {key: config[key] for key in sorted(wanted) if key in config}


def memory_hash(config: Mapping[str, Any], extra_keys: Iterable[str] = (), *, foreign: bool = False) -> str:
    """Stable hash of `memory_config` (16 hex digits): the first part of a shape key."""
    content = json.dumps(memory_config(config, extra_keys, foreign=foreign), sort_keys=True, default=str)
    return hashlib.sha256(content.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ShapeParts:
    base: str  # memory hash | model: equal for every task of one received config
    task: str


def shape_label(config_name: str, level: int, data: str) -> str:
    """How `orch memory` names a shape: its config, ladder level and task."""
    return f"{config_name} L{level} {data}"


def parse_shape_key(key: str) -> ShapeParts | None:
    """The parts of a key built by `orchestrator.prediction.memory.shape_key`; None for a key of another
    form. Tasks hold no '|' (their character set is restricted); models may."""
    parts = key.rsplit("|", 1)
    if len(parts) != 2 or "|" not in parts[0]:
        return None
    return ShapeParts(parts[0], parts[1])


@dataclass(frozen=True)
class RunningPeak:
    """The largest peak so far among live attempts of one shape that passed the provisional
    point (K optimizer steps, and their first evaluation where the worker evaluates)."""

    peak_mib: int
    step: int  # the furthest step among them
    attempts: int = 1


PROVISIONAL_STEPS = 10  # K: optimizer steps before a running attempt's peak is used


def provisional_step_reached(
    step: int | None, eval_every_steps: int | None, min_steps: int = PROVISIONAL_STEPS
) -> bool:
    """A running attempt's peak so far stands for its shape once it has run `min_steps` steps and,
    when its worker evaluates every N steps, its first evaluation (step N) is behind it."""
    if step is None or step < min_steps:
        return False
    return not (eval_every_steps and eval_every_steps > 0 and step <= eval_every_steps)


def running_margin(step: int, min_steps: int = PROVISIONAL_STEPS) -> float:
    """15 % at step K, shrinking towards 5 % as the attempt runs on: later batches can be longer
    (GLUE pads each batch to its longest prompt), so an early peak may still grow a little."""
    return 0.05 + 0.10 * min(1.0, min_steps / max(step, 1))


def measured_margin(samples: int) -> float:
    """5 % over one completed attempt, shrinking with more of them, never below 2 %."""
    return max(0.02, 0.05 / math.sqrt(max(samples, 1)))


def fold_running(peaks: Iterable[tuple[K, int, int]]) -> dict[K, RunningPeak]:
    """(shape key, peak so far, step) of every live attempt past the provisional point ->
    one RunningPeak per shape."""
    out: dict[K, RunningPeak] = {}
    for key, peak_mib, step in peaks:
        old = out.get(key)
        if old is None:
            out[key] = RunningPeak(peak_mib, step, 1)
        else:
            out[key] = RunningPeak(max(old.peak_mib, peak_mib), max(old.step, step), old.attempts + 1)
    return out


@dataclass(frozen=True)
class Transfer:
    """A peak borrowed from a neighbouring shape, already scaled to this one."""

    mib: int
    source: PredictionSource  # SourceKind.LEVEL or TASK, with where it was borrowed from


def level_transfer(
    level: int, peaks_by_level: Mapping[int, int], estimate_ratio: Mapping[int, float] | None = None
) -> Transfer | None:
    """A peak measured at a lower ladder level bounds every higher one from above (each rung
    only removes memory: checkpointing, fewer kept logits, half the batch). The nearest lower
    level wins; `estimate_ratio[j]` (estimate at `level` / estimate at j, at most 1) scales it
    down where the estimate knows how much the rungs between save."""
    lower = [j for j in peaks_by_level if j < level]
    if not lower:
        return None
    j = max(lower)
    ratio = min(1.0, (estimate_ratio or {}).get(j, 1.0))
    return Transfer(math.ceil(peaks_by_level[j] * ratio), PredictionSource(SourceKind.LEVEL, level=j))


def task_transfer(
    prompt_tokens: int | None, peaks_by_task: Mapping[str, tuple[int, int | None]]
) -> Transfer | None:
    """A peak of the same config and level on another task, scaled by the learned prompt lengths:
    (peak, that task's longest prompt) per task. A task whose prompts are no longer than this
    one's bounds it from below; scaling the whole peak by the length ratio bounds it from above
    (the weights do not grow with the prompt). The smallest upper bound wins."""
    if prompt_tokens is None or prompt_tokens <= 0:
        return None
    bounds: list[tuple[int, str, PredictionSource]] = []
    for task, (peak_mib, tokens) in sorted(peaks_by_task.items()):
        if tokens is None or tokens <= 0:
            continue
        scaled = math.ceil(peak_mib * max(1.0, prompt_tokens / tokens))
        source = PredictionSource(SourceKind.TASK, task=task, task_tokens=tokens, tokens=prompt_tokens)
        bounds.append((scaled, source.borrowed(), source))  # ties broken by the text, as shown
    if not bounds:
        return None
    mib, _, source = min(bounds, key=lambda bound: bound[:2])
    return Transfer(mib, source)
