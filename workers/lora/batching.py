"""Tokenising prompts (truncated field by field) and left-padded batches (the answer is always the last position)."""

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


def field_caps(lengths: Sequence[int], budget: int) -> list[int]:
    """Token counts to keep per text field so that they sum to at most `budget` where that can
    be: the longest field is shortened first (down to the next longest, then both, evenly), and
    no field drops below one token (a pair task keeps its hypothesis). Pure."""
    if sum(lengths) <= budget:
        return list(lengths)
    level = max(1, max((cap for cap in range(1, max(lengths) + 1) if sum(min(n, cap) for n in lengths) <= budget),
                       default=1))
    caps = [min(n, level) for n in lengths]
    spare = budget - sum(caps)
    for i, n in enumerate(lengths):  # what is left of the budget goes to the first long fields
        if spare <= 0:
            break
        if n > level:
            caps[i] += 1
            spare -= 1
    return caps


def encode(tokenizer: Any, task: str, examples: Sequence[Example], max_seq_len: int) -> list[Encoded]:
    """Token ids of each prompt, truncated as `encode_counted` does."""
    return encode_counted(tokenizer, task, examples, max_seq_len)[0]


def encode_counted(
    tokenizer: Any, task: str, examples: Sequence[Example], max_seq_len: int
) -> tuple[list[Encoded], int]:
    """Token ids of each prompt and how many prompts had to be truncated. An over-long prompt
    loses the end of its longest text field first, never a whole field nor the question line;
    only a prompt whose fixed parts alone are too long loses text from the middle."""
    tail_len = len(tokenizer(TASKS[task].tail, add_special_tokens=False)["input_ids"])
    encoded, truncated = [], 0
    for example in examples:
        ids = list(tokenizer(prompt_text(task, example.texts))["input_ids"])
        if len(ids) > max_seq_len:
            truncated += 1
            ids = _shortened(tokenizer, task, example.texts, ids, max_seq_len, tail_len)
        encoded.append(Encoded(ids, example.label))
    return encoded, truncated


def _shortened(
    tokenizer: Any, task: str, texts: Sequence[str], ids: list[int], max_seq_len: int, tail_len: int
) -> list[int]:
    fields = [list(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
    excess = len(ids) - max_seq_len
    for _ in range(4):  # re-tokenising the cut text may merge differently: a few more tokens off
        caps = field_caps([len(f) for f in fields], sum(len(f) for f in fields) - excess)
        cut = tuple(tokenizer.decode(f[:cap], skip_special_tokens=True) for f, cap in zip(fields, caps, strict=True))
        shortened = list(tokenizer(prompt_text(task, cut))["input_ids"])
        if len(shortened) <= max_seq_len:
            return shortened
        if caps == [min(1, len(f)) for f in fields]:
            break
        excess += len(shortened) - max_seq_len
    # The template and question alone do not fit: keep the head and the question line.
    keep_head = max(1, max_seq_len - tail_len)
    return (ids[:keep_head] + ids[-tail_len:])[-max_seq_len:]


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
