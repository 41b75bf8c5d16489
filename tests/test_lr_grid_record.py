"""The recorder of the early-stopping benchmark's curves (benchmarks/lr_grid_record.py): its task's
labels follow the cue majority with the asked share flipped, and one short run of the LoRA worker
gives back the validation history the worker wrote."""

from __future__ import annotations

import random
from pathlib import Path

from benchmarks.lr_grid_record import (
    LABELS,
    NEGATIVE,
    POSITIVE,
    cue_examples,
    record_one,
    val_history,
    write_task,
)
from workers.lora.base_cache import BaseCache


def _majority(first: str, second: str) -> str:
    words = f"{first} {second}".split()
    positive = sum(w in POSITIVE for w in words)
    negative = sum(w in NEGATIVE for w in words)
    assert positive + negative in (1, 3, 5)
    return LABELS[0] if positive > negative else LABELS[1]


def test_the_label_is_the_cue_majority_with_a_share_flipped() -> None:
    clean = cue_examples(2000, random.Random(1), noise=0.0)
    assert all(label == _majority(a, b) for a, b, label in clean)
    noisy = cue_examples(2000, random.Random(1), noise=0.15)
    flipped = sum(label != _majority(a, b) for a, b, label in noisy) / len(noisy)
    assert 0.12 < flipped < 0.18
    assert 0.4 < sum(label == LABELS[0] for _, _, label in clean) / len(clean) < 0.6


def test_one_short_run_records_its_validation_history(tmp_path: Path) -> None:
    data = write_task(tmp_path / "data", "cues", n_train=100, n_dev=20, noise=0.15)
    run = record_one(BaseCache(), data, tmp_path, lr=2e-3, rank=4, seed=1, steps=6, eval_every=2)
    assert [step for step, _ in run["val"]] == [2, 4, 6]
    assert all(0.0 <= value <= 1.0 for _, value in run["val"])
    assert run["lr"] == 2e-3 and run["r"] == 4 and run["seconds"] > 0


def test_a_damaged_progress_file_loses_its_bad_lines_only(tmp_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    progress.write_text(
        '{"step": 16, "val": {"accuracy": 0.5}}\n{"step": 17, "loss": 0.7}\n[1, 2]\n'
        '{"step": "x", "val": {"accuracy": 0.6}}\n{"step": 32, "val": {"accuracy": 0.62\n',
        encoding="utf-8",
    )
    assert val_history(progress) == [[16, 0.5]]
