"""Writes learnable toy GLUE-shaped tasks: the label is given away by a keyword in the input.

    python -m workers.lora.sample_data --out DIR [--tasks rte,qnli] [--n-train N] [--n-dev N]
                                       [--format tsv|jsonl] [--seed S]

TSV output follows the GLUE release layout (`RTE/train.tsv`, `MNLI/dev_matched.tsv`, ...);
JSON Lines output uses the HF field names (`rte/train.jsonl`, `rte/validation.jsonl`).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from workers.lora.data import TASKS

FILLER = [
    "the",
    "a",
    "cat",
    "dog",
    "bird",
    "tree",
    "house",
    "river",
    "car",
    "road",
    "city",
    "park",
    "book",
    "table",
    "window",
    "door",
    "sun",
    "moon",
    "day",
    "night",
    "man",
    "woman",
    "child",
    "friend",
    "teacher",
    "music",
    "food",
    "water",
    "game",
    "story",
    "film",
    "song",
]
# One marker word per class id; the rest of the text is filler.
MARKERS = ("red", "blue", "green")
TSV_LABELS = {
    "mnli": ("entailment", "neutral", "contradiction"),
    "qnli": ("entailment", "not_entailment"),
    "rte": ("entailment", "not_entailment"),
}
VOCABULARY = tuple(FILLER) + MARKERS


def make_examples(task: str, n: int, rng: random.Random) -> list[tuple[tuple[str, ...], int]]:
    spec = TASKS[task]
    n_classes = len(spec.label_words)
    examples = []
    for _ in range(n):
        label = rng.randrange(n_classes)
        texts = [
            " ".join(rng.choice(FILLER) for _ in range(rng.randint(4, 9))) for _ in spec.fields
        ]
        words = texts[-1].split()
        words.insert(rng.randrange(len(words) + 1), MARKERS[label])
        texts[-1] = " ".join(words)
        examples.append((tuple(texts), label))
    return examples


def write_task(out: Path, task: str, fmt: str, n_train: int, n_dev: int, seed: int) -> Path:
    spec = TASKS[task]
    rng = random.Random(f"{seed}:{task}")
    splits = {"train": make_examples(task, n_train, rng), "dev": make_examples(task, n_dev, rng)}
    if task == "mnli":  # MNLI's second validation set (other genres in GLUE)
        splits["dev_mismatched"] = make_examples(task, n_dev, rng)
    if fmt == "jsonl":
        folder = out / task
        folder.mkdir(parents=True, exist_ok=True)
        for split, examples in splits.items():
            name = {"train": "train.jsonl", "dev": "validation.jsonl"}.get(split, "validation_mismatched.jsonl")
            with open(folder / name, "w", encoding="utf-8") as handle:
                for idx, (texts, label) in enumerate(examples):
                    row = dict(zip(spec.fields, texts, strict=True)) | {"label": label, "idx": idx}
                    handle.write(json.dumps(row) + "\n")
        return folder
    folder = out / spec.glue_dir
    folder.mkdir(parents=True, exist_ok=True)
    for split, examples in splits.items():
        name = "dev_matched.tsv" if split == "dev" and task == "mnli" else f"{split}.tsv"  # dev_mismatched.tsv
        (folder / name).write_text(_tsv(task, examples), encoding="utf-8")
    return folder


def _tsv(task: str, examples: list[tuple[tuple[str, ...], int]]) -> str:
    spec = TASKS[task]
    names = TSV_LABELS.get(task)
    lines = []
    if task != "cola":  # CoLA ships without a header
        lines.append("\t".join(("index", *spec.tsv_fields, spec.tsv_label)))
    for idx, (texts, label) in enumerate(examples):
        value = names[label] if names else str(label)
        if task == "cola":
            lines.append("\t".join(("toy", value, "", texts[0])))
        else:
            lines.append("\t".join((str(idx), *texts, value)))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.lora.sample_data", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", default="rte,qnli,sst2,mrpc,cola,mnli,qqp,wnli")
    parser.add_argument("--n-train", type=int, default=200)
    parser.add_argument("--n-dev", type=int, default=50)
    parser.add_argument("--format", choices=("tsv", "jsonl"), default="tsv")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        parser.error(f"unknown task(s): {', '.join(unknown)} (known: {', '.join(TASKS)})")
    for task in tasks:
        folder = write_task(args.out, task, args.format, args.n_train, args.n_dev, args.seed)
        print(f"{task}: {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
