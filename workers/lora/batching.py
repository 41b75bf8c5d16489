"""Tokenising prompts and left-padded batches (the answer is always the last position)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from workers.lora.config import ConfigError
from workers.lora.data import DIGIT_WORDS, TASKS, Example, prompt_text


class Encoded(NamedTuple):
    input_ids: list[int]  # the prompt; the model predicts the answer token after it
    label: int  # class id


def answer_token_ids(tokenizer: Any, task: str) -> list[int]:
    """One token id per class: the task's label words, else digits, each a single token in context."""
    spec = TASKS[task]
    n_classes = len(spec.label_words)
    for words in (spec.label_words, DIGIT_WORDS[:n_classes]):
        ids = [_single_token(tokenizer, spec.tail, word) for word in words]
        if all(i is not None for i in ids) and len(set(ids)) == n_classes:
            return [int(i) for i in ids if i is not None]
    raise ConfigError(
        f"tokenizer has no single-token label words for {task} (tried {spec.label_words})"
    )


def _single_token(tokenizer: Any, context: str, word: str) -> int | None:
    # Probe in context: sentencepiece and BPE tokenizers merge a leading space differently.
    before = tokenizer(context, add_special_tokens=False)["input_ids"]
    after = tokenizer(context + word, add_special_tokens=False)["input_ids"]
    if len(after) != len(before) + 1 or after[: len(before)] != before:
        return None
    token = int(after[-1])
    return None if token == tokenizer.unk_token_id else token


def encode(
    tokenizer: Any, task: str, examples: Sequence[Example], max_seq_len: int
) -> list[Encoded]:
    """Token ids of each prompt; over-long prompts lose text from the middle, never the question."""
    tail_len = len(tokenizer(TASKS[task].tail, add_special_tokens=False)["input_ids"])
    keep_head = max(1, max_seq_len - tail_len)
    encoded = []
    for example in examples:
        ids = list(tokenizer(prompt_text(task, example.texts))["input_ids"])
        if len(ids) > max_seq_len:
            ids = ids[:keep_head] + ids[-tail_len:]
        encoded.append(Encoded(ids[-max_seq_len:], example.label))
    return encoded


class LeftPadCollator:
    """Stacks prompts, padded on the left, with position ids that skip the padding."""

    def __init__(self, pad_token_id: int, answer_ids: Sequence[int]) -> None:
        self.pad_token_id = pad_token_id
        self.answer_ids = list(answer_ids)

    def __call__(self, batch: Sequence[Encoded]) -> dict[str, torch.Tensor]:
        length = max(len(item.input_ids) for item in batch)
        input_ids = torch.full((len(batch), length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), length), dtype=torch.long)
        for row, item in enumerate(batch):
            input_ids[row, length - len(item.input_ids) :] = torch.tensor(item.input_ids)
            attention_mask[row, length - len(item.input_ids) :] = 1
        labels = torch.tensor([item.label for item in batch], dtype=torch.long)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "labels": labels,
            "target_ids": torch.tensor([self.answer_ids[y] for y in labels.tolist()]),
        }
