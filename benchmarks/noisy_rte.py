"""The runs the ladder's numerics are measured on, by the benchmark (benchmarks/ladder_numerics.py)
and the test that holds it to its figures (tests/test_lora_equivalence.py): the LoRA worker's tiny
Llama on RTE sample data with every fourth training label flipped, so that the task is learnable
but not perfectly and the scores can move."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FLIPPED = {"entailment": "not_entailment", "not_entailment": "entailment"}


def flip_every_fourth_label(data_dir: Path) -> Path:
    """Flip the label of every fourth example in `data_dir`'s RTE/train.tsv, in place."""
    path = data_dir / "RTE" / "train.tsv"
    header, *rows = path.read_text(encoding="utf-8").splitlines()
    kept = [header]
    for index, row in enumerate(rows):
        cells = row.split("\t")
        if index % 4 == 0:
            cells[-1] = FLIPPED[cells[-1]]
        kept.append("\t".join(cells))
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return data_dir


def numerics_config(data_dir: Path, *, steps: int, eval_every_steps: int, prec: str, seed: int,
                    dropout: float) -> dict[str, Any]:  # fmt: skip
    """Level 0's LoRA worker config: batch 8, LoRA r 8 on q, v and lm_head, nothing saved."""
    return {
        "model": "tiny-llama", "data": "glue-tvt_rte", "data_dir": str(data_dir),
        "peft": {"r": 8, "alpha": 16, "dropout": dropout, "targets": ["q_proj", "v_proj", "lm_head"]},
        "batch_size": 8, "learning_rate": 2e-3, "max_steps": steps, "eval_every_steps": eval_every_steps,
        "prec": prec, "seed": seed, "no_save": True, "checkpoint_every_steps": 0,
    }  # fmt: skip
