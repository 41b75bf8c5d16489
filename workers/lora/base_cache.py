"""What a LoRA worker process keeps between jobs: the frozen base model on its device, its
tokenizer, and each task's tokenised splits.

A fresh process (`share_base: off`) makes one for its single job; the warm process of
`share_base: sequential` (workers.lora.server) keeps one for its life. Both take the same path
through it (the base is built and moved to the device before LoRA is applied), so a job's numbers
do not depend on which process trains it. Between jobs `release` takes the adapter out again and
leaves the base as it was loaded.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch

from workers.lora.batching import Encoded, encode_counted
from workers.lora.config import RunConfig
from workers.lora.data import load_splits
from workers.lora.model import is_checkpointing, load_model

Log = Callable[[str], None]
Splits = tuple[dict[str, list[Encoded]], dict[str, int]]  # (encoded per split, truncated per split)


class BaseCache:
    """The base model of one base key, and the tokenised splits of each task it trained on."""

    def __init__(self) -> None:
        self._model_key: tuple[str, str, str] | None = None
        self._base: tuple[Any, Any, str] | None = None  # (model, tokenizer, kind)
        self._splits: dict[tuple[str, str, int, str], Splits] = {}
        self._adapted: Any = None  # the PEFT model of the job running now

    def base(
        self,
        config: RunConfig,
        dtype: torch.dtype,
        device: torch.device,
        log: Log,
        model_digest: str = "",
    ) -> tuple[Any, Any, str]:
        """(base model on `device`, tokenizer, kind); loaded once per model, dtype and device."""
        key = (config.model, f"{dtype}:{device}", model_digest)
        if self._base is None or self._model_key != key:
            self._base = None
            self._splits.clear()  # tokenised by the tokenizer of the model before
            model, tokenizer, kind = load_model(config, dtype, log)
            self._base = (model.to(device), tokenizer, kind)
            self._model_key = key
        return self._base

    def splits(self, config: RunConfig, tokenizer: Any, data_digest: str = "") -> Splits:
        """Each split of the job's task, tokenised; kept per (data, folder, max_seq_len, data
        content digest). An empty digest (the content could not be hashed) is never kept."""
        key = (config.data, str(config.data_dir), config.max_seq_len, data_digest)
        if data_digest and key in self._splits:
            return self._splits[key]
        assert config.data_dir is not None  # checked before training starts
        examples = load_splits(config.data, config.data_dir)
        encoded: dict[str, list[Encoded]] = {}
        truncated: dict[str, int] = {}
        for name, items in examples.items():
            encoded[name], truncated[name] = encode_counted(
                tokenizer, _task(config), items, config.max_seq_len
            )
        if data_digest:
            self._splits[key] = (encoded, truncated)
        return encoded, truncated

    def base_mem_mib(self) -> int | None:
        """The loaded base's weights on its CUDA device, MiB; None before loading and on CPU."""
        if self._base is None:
            return None
        parameters = list(self._base[0].parameters())
        if not parameters or parameters[0].device.type != "cuda":
            return None
        return -(-sum(p.numel() * p.element_size() for p in parameters) // (1024 * 1024))

    def adapted(self, model: Any) -> Any:
        """Remember the job's PEFT model, so that `release` can take its adapter out."""
        self._adapted = model
        return model

    def release(self) -> None:
        """Take the job's adapter out of the base (peft's `unload`: no merge), switch
        checkpointing off, and give the job's memory back (the CUDA cache included), so that
        the next job starts from the base as loaded and its peak is its own."""
        adapted, self._adapted = self._adapted, None
        if adapted is not None and self._base is not None:
            base = adapted.unload() if hasattr(adapted, "unload") else adapted
            if is_checkpointing(base):
                disable = getattr(base, "activation_checkpointing_disable", None)
                (disable or base.gradient_checkpointing_disable)()
            for parameter in base.parameters():
                parameter.grad = None
            self._base = (base, *self._base[1:])
            if hasattr(base, "peft_config"):
                del base.peft_config  # peft would take the next adapter for a second one
        del adapted
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _task(config: RunConfig) -> str:
    from workers.lora.data import parse_data_name

    return parse_data_name(config.data).task
