"""The fused group's LoRA routing as it was first written (one addition a member, each after
peft's cast of its rows), kept as the reference the stacked routing of workers/lora/routing.py
is held to (tests/test_lora_routing.py: bit-equal under bf16 autocast on CPU, within float
rounding in fp32, where a batched matmul is not the plain one) and timed against
(benchmarks/gpu/fused_tick.py `--routing loop`)."""

from __future__ import annotations

from typing import Any

import torch

from workers.lora.routing import Routes


def loop_forward(layer: Any, routes: Routes, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Each member's slice of the base output plus its own adapter's output, joined."""
    if routes.now is None:
        raise RuntimeError("a fused group's forward ran without routes")
    result = layer.base_layer(x, *args, **kwargs)
    dtype = result.dtype
    pieces = []
    for adapter, start, stop in routes.now:
        part = result[start:stop]
        if adapter in layer.lora_A and not layer.disable_adapters:
            lora_A, lora_B = layer.lora_A[adapter], layer.lora_B[adapter]
            rows = x[start:stop]  # cast to the LoRA weights' dtype, as peft casts it
            rows = rows if rows.dtype == lora_A.weight.dtype else rows.to(dtype=lora_A.weight.dtype)
            part = part + lora_B(lora_A(layer.lora_dropout[adapter](rows))) * layer.scaling[adapter]
        pieces.append(part.to(dtype))
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)
