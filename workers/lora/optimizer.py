"""One optimizer update: AdamW on the LoRA parameters, the learning-rate schedule, the
gradient-norm clip after accumulation, and the guard that stops a run whose loss is not finite.

The clip acts on the gradient of the whole accumulated group (HF Trainer's order: accumulate,
clip, step), so it does not change when the ladder halves the micro-batch. A loss or gradient
norm that is NaN or infinite ends the run at once, naming the step: argmax over NaN logits
still yields a score, which would otherwise be reported as a result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from workers.lora.config import RunConfig

ADAM_BETAS = (0.9, 0.999)  # torch's and HF Trainer's defaults
ADAM_EPS = 1e-8


class Update(NamedTuple):
    grad_norm: float  # of the accumulated gradient, before clipping
    learning_rate: float  # the rate this update used


class NonFiniteLoss(RuntimeError):
    """The loss or the gradient norm became NaN or infinite: the run has diverged."""


def warmup_steps(config: RunConfig, total_steps: int) -> int:
    """HF Trainer's rule: `warmup_steps` when positive, else ceil(warmup_ratio x total steps)."""
    if config.warmup_steps > 0:
        return config.warmup_steps
    return math.ceil(config.warmup_ratio * total_steps)


def lr_factor(step: int, total_steps: int, warmup: int, schedule: str) -> float:
    """The learning rate's multiplier before update `step` (0-based), as HF's schedules define it:
    linear warm-up from 0 over `warmup` updates, then constant, linear decay to 0 or half a cosine."""
    if step < warmup:
        return step / max(1, warmup)
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total_steps - warmup)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    if schedule == "cosine":
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    raise ValueError(f"unknown schedule {schedule!r}")


def describe_optimizer(config: RunConfig, total_steps: int) -> dict[str, Any]:
    """The optimizer as it ran, for result.json."""
    return {
        "name": "AdamW", "learning_rate": config.learning_rate, "betas": list(ADAM_BETAS),
        "eps": ADAM_EPS, "weight_decay": config.weight_decay, "lr_scheduler": config.lr_scheduler,
        "warmup_steps": warmup_steps(config, total_steps), "total_steps": total_steps,
        "max_grad_norm": config.max_grad_norm or None,
    }  # fmt: skip


def build_optimizer(
    params: Sequence[torch.nn.Parameter], config: RunConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    optimizer = torch.optim.AdamW(
        params, lr=config.learning_rate, betas=ADAM_BETAS, eps=ADAM_EPS,
        weight_decay=config.weight_decay,
    )  # fmt: skip
    warmup = warmup_steps(config, total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, warmup, config.lr_scheduler)
    )
    return optimizer, scheduler


def apply_update(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    params: Sequence[torch.nn.Parameter],
    max_grad_norm: float,
    mean_loss: float,
    step: int,
    total_steps: int,
) -> Update:
    """Check the group's loss, clip the accumulated gradient, step. `step` is the 1-based
    number of this update; raises NonFiniteLoss naming it."""
    if not math.isfinite(mean_loss):
        raise NonFiniteLoss(
            f"loss is {mean_loss} at optimizer step {step} of {total_steps}: the run diverged "
            "(lower learning_rate, or add warm-up)"
        )
    limit = max_grad_norm if max_grad_norm > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, limit))
    if not math.isfinite(grad_norm):
        raise NonFiniteLoss(
            f"gradient norm is {grad_norm} at optimizer step {step} of {total_steps}: the run "
            "diverged (lower learning_rate, or add warm-up)"
        )
    learning_rate = float(optimizer.param_groups[0]["lr"])
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return Update(grad_norm, learning_rate)
