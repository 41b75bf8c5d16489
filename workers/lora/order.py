"""The order of the training examples: one permutation per (seed, epoch).

The order depends on nothing else: not on the loader's worker processes (a `num_data_workers: 0`
rung sees the same batches), not on the batch size (a halved batch with doubled accumulation
groups the same examples into each optimizer step), and not on what ran before (a resumed run
skips the examples its checkpoint had consumed and continues in the same order).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


def epoch_permutation(n_examples: int, seed: int, epoch: int) -> list[int]:
    """Indices 0..n_examples-1 in the order of `epoch` of a run with `seed`."""
    # A hash of both, not seed + epoch: seed 1 epoch 0 and seed 0 epoch 1 must differ.
    digest = hashlib.sha256(f"lora-order:{seed}:{epoch}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    return torch.randperm(n_examples, generator=generator).tolist()


class EpochOrder(Sampler[int]):
    """The loader's sampler: the current epoch's permutation, from its `skip`-th example on.

    The loader asks for a fresh iterator at each `iter(loader)` (persistent workers included),
    so `set_epoch` before each epoch is all it takes."""

    def __init__(self, n_examples: int, seed: int) -> None:
        self.n_examples = n_examples
        self.seed = seed
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self.skip = epoch, min(max(0, skip), self.n_examples)

    def __iter__(self) -> Iterator[int]:
        return iter(epoch_permutation(self.n_examples, self.seed, self.epoch)[self.skip :])

    def __len__(self) -> int:
        return self.n_examples - self.skip
