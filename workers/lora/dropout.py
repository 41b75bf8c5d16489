"""LoRA dropout whose masks depend on what a step trains on, not on how the rung computes it.

peft's LoRA dropout is `nn.Dropout`: each call draws from torch's global RNG in the shape of its
input. With `logits_to_keep: 1`, lm_head's input is the last position only ([batch, 1, hidden]
instead of [batch, seq, hidden]), so it draws another mask there, and every later draw of the run
shifts along the global stream: the rung that only saves logits memory changed the numbers.

Here each dropout call draws from its own generator, seeded by (run seed, optimizer step,
micro-batch, module name), and always in the full shape of the micro-batch's sequence; a sliced
input takes the mask's last positions. The mask is therefore the same with or without
`logits_to_keep`, with or without checkpointing (the recomputation reads the same key), whatever
else consumed the global RNG, and after a resume. Halving the micro-batch still changes the
masks: the micro-batches themselves differ.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

KEYED_DROPOUT = "keyed by (seed, optimizer step, micro-batch, module), full sequence shape"


@dataclass
class DrawKey:
    """Where the training loop is; read by every KeyedDropout of one model."""

    seed: int
    step: int = 0  # optimizer steps done before the one being computed
    micro_batch: int = 0  # index of the micro-batch within its optimizer step
    sequence_length: int = 0  # positions of the micro-batch's (padded) prompts

    def at(self, step: int, micro_batch: int, sequence_length: int) -> None:
        self.step, self.micro_batch, self.sequence_length = step, micro_batch, sequence_length


def draw_seed(seed: int, step: int, micro_batch: int, module: str) -> int:
    """A 63-bit generator seed for one module's mask in one micro-batch."""
    digest = hashlib.blake2b(f"{seed}:{step}:{micro_batch}:{module}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") >> 1


class KeyedDropout(torch.nn.Module):
    """Inverted dropout (as nn.Dropout: keep with 1 - p, scale by 1 / (1 - p)) with keyed masks."""

    def __init__(self, p: float, module: str, key: DrawKey) -> None:
        super().__init__()
        self.p, self.module, self.key = p, module, key
        # one generator per device, seeded again for each draw (the seed sets its whole state),
        # rather than one made for each draw (on an H200: 13.0 against 14.8 µs a draw)
        self._generators: dict[torch.device, torch.Generator] = {}

    def extra_repr(self) -> str:
        return f"p={self.p}, keyed"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        return x * self.keep_mask(torch.empty(x.shape, dtype=x.dtype, device=x.device)).div_(1 - self.p)

    def keep_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """`mask` (contiguous, in the shape of this call's input) filled with the call's keep mask:
        1 with probability 1 - p, drawn in the full shape of the micro-batch's sequence."""
        shape = list(mask.shape)
        positions = shape[-2] if mask.dim() >= 3 else 0
        length = self.key.sequence_length
        if positions == 0 or length in (0, positions):
            return self._draw(mask)
        shape[-2] = length
        drawn = self._draw(torch.empty(shape, dtype=mask.dtype, device=mask.device))
        if positions < length:  # sliced by logits_to_keep: the whole mask's last positions
            return mask.copy_(drawn[..., -positions:, :])
        # a fused group's longer left padding: the job's own positions are the last ones, the
        # padding before them is kept
        mask[..., : positions - length, :].fill_(1 - self.p)
        mask[..., positions - length :, :].copy_(drawn)
        return mask

    def _draw(self, mask: torch.Tensor) -> torch.Tensor:
        generator = self._generators.get(mask.device)
        if generator is None:
            generator = self._generators[mask.device] = torch.Generator(device=mask.device)
        generator.manual_seed(
            draw_seed(self.key.seed, self.key.step, self.key.micro_batch, self.module)
        )
        return mask.bernoulli_(1 - self.p, generator=generator)


def stacked_masks(dropouts: list[torch.nn.Module], rows: torch.Tensor) -> torch.Tensor | None:
    """The masks, scaled by 1 / (1 - p), that a fused stack's KeyedDropouts would each multiply
    its member's rows by, drawn into one tensor: `rows` is (members, *a member's rows). One
    division for all of them (and the caller's one multiplication) instead of three kernels a
    member; each member's mask is the one it draws alone (its own key and generator). None for
    other dropouts, or p differing: each member's dropout then runs on its own rows."""
    keyed = [d for d in dropouts if isinstance(d, KeyedDropout) and d.training]
    if len(keyed) != len(dropouts) or keyed[0].p == 0 or any(d.p != keyed[0].p for d in keyed):
        return None
    masks = torch.empty(rows.shape, dtype=rows.dtype, device=rows.device)
    for dropout, mask in zip(keyed, masks, strict=True):
        dropout.keep_mask(mask)
    return masks.div_(1 - keyed[0].p)


def install_keyed_dropout(model: Any, seed: int, adapter: str | None = None) -> DrawKey | None:
    """Replace every LoRA dropout with p > 0 by a KeyedDropout sharing one DrawKey, which the
    training loop moves before each micro-batch. None when the model has no LoRA dropout.
    `adapter`: only that adapter's dropouts (one job of a fused group), keyed as the job's own
    "default" adapter would be, so that its masks are those it draws alone."""
    key = DrawKey(seed)
    replaced = 0
    for name, module in model.named_modules():
        dropouts = getattr(module, "lora_dropout", None)
        if not isinstance(dropouts, torch.nn.ModuleDict):
            continue
        for own, dropout in list(dropouts.items()):
            if adapter is not None and own != adapter:
                continue
            if isinstance(dropout, torch.nn.Dropout) and dropout.p > 0:
                keyed_as = own if adapter is None else "default"
                dropouts[own] = KeyedDropout(dropout.p, f"{name}.{keyed_as}", key)
                replaced += 1
    return key if replaced else None
