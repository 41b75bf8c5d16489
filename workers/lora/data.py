"""GLUE tasks framed as language modelling: prompt + input text(s) -> one answer token.

Data names as users write them: `glue_<task>` (official train / validation), `glue-tvt_<task>`
(train split 80/20 into train/val, official validation as test), with an optional `_N` suffix
keeping N training examples. Sources, in order: GLUE TSV release layout, JSON Lines with the
HF field names, a `datasets.save_to_disk` folder. No torch at import time.
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the data-name grammar is orch's too: it refuses a mistyped name at submit
from orchestrator.plans.lora_values import parse_data_name
from workers.lora.config import ConfigError

# Fixed, independent of the run seed: every seed of a sweep sees the same splits and subsets.
SPLIT_SEED = 1234
TRAIN_FRACTION = 0.8
DIGIT_WORDS = (" 0", " 1", " 2")
# MNLI's second test set (genres unseen in training): scored as its own split, `test_mismatched`.
MISMATCHED_TASKS = ("mnli",)
MISMATCHED_SPLIT = "test_mismatched"


@dataclass(frozen=True)
class TaskSpec:
    name: str
    glue_dir: str  # folder name in the GLUE release
    fields: tuple[str, ...]  # HF field names of the input texts
    tsv_fields: tuple[str, ...]  # TSV header names of the same texts
    tsv_label: str
    label_map: dict[str, int] | None  # TSV label strings -> HF ids; None: already ints
    template: str  # uses {0}, {1} for the texts
    tail: str  # the question line: kept when truncating, probes the answer token
    label_words: tuple[str, ...]  # by HF label id


_NLI = {"entailment": 0, "not_entailment": 1}
TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec("cola", "CoLA", ("sentence",), ("3",), "1", None,
                 "Sentence: {0}\n", "Is this sentence grammatical? Answer:", (" no", " yes")),
        TaskSpec("sst2", "SST-2", ("sentence",), ("sentence",), "label", None,
                 "Review: {0}\n", "Sentiment:", (" negative", " positive")),
        TaskSpec("mrpc", "MRPC", ("sentence1", "sentence2"), ("#1 String", "#2 String"), "Quality",
                 None, "Sentence 1: {0}\nSentence 2: {1}\n",
                 "Do both sentences mean the same thing? Answer:", (" no", " yes")),
        TaskSpec("qqp", "QQP", ("question1", "question2"), ("question1", "question2"),
                 "is_duplicate", None, "Question 1: {0}\nQuestion 2: {1}\n",
                 "Do both questions ask the same thing? Answer:", (" no", " yes")),
        TaskSpec("mnli", "MNLI", ("premise", "hypothesis"), ("sentence1", "sentence2"), "gold_label",
                 {"entailment": 0, "neutral": 1, "contradiction": 2},
                 "Premise: {0}\nHypothesis: {1}\n",
                 "Does the premise entail the hypothesis? Answer:", (" yes", " maybe", " no")),
        TaskSpec("qnli", "QNLI", ("question", "sentence"), ("question", "sentence"), "label", _NLI,
                 "Question: {0}\nSentence: {1}\n",
                 "Does the sentence answer the question? Answer:", (" yes", " no")),
        TaskSpec("rte", "RTE", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label", _NLI,
                 "Sentence 1: {0}\nSentence 2: {1}\n",
                 "Does sentence 1 entail sentence 2? Answer:", (" yes", " no")),
        TaskSpec("wnli", "WNLI", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label",
                 None, "Sentence 1: {0}\nSentence 2: {1}\n",
                 "Does sentence 1 entail sentence 2? Answer:", (" no", " yes")),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Example:
    texts: tuple[str, ...]
    label: int


def test_is_validation(name: str) -> bool:
    """`glue_<task>` scores test on the official validation split, the one that also picked the
    best epoch: the test figure is then optimistic, and result.json says so (`test_is_val`)."""
    return parse_data_name(name).kind == "glue"


def find_source(data_dir: Path, task: str) -> tuple[str, Path]:
    """Which format holds `task` under `data_dir`: ("tsv"|"jsonl"|"hf", folder)."""
    spec = TASKS[task]
    if not data_dir.is_dir():
        raise ConfigError(f"data directory not found: {data_dir}")
    for folder in (data_dir / spec.glue_dir, data_dir / task):
        if (folder / "train.tsv").is_file():
            return "tsv", folder
    if (data_dir / task / "train.jsonl").is_file():
        return "jsonl", data_dir / task
    if (data_dir / task / "dataset_dict.json").is_file():
        return "hf", data_dir / task
    raise ConfigError(
        f"no data for {task!r} in {data_dir}: expected {spec.glue_dir}/train.tsv, "
        f"{task}/train.jsonl or a save_to_disk folder {task}/"
    )


def load_splits(name: str, data_dir: Path) -> dict[str, list[Example]]:
    """train / val / test examples for a data name."""
    parsed = parse_data_name(name)
    fmt, folder = find_source(data_dir, parsed.task)
    train = read_split(fmt, folder, parsed.task, "train")
    official_val = read_split(fmt, folder, parsed.task, "validation")
    if parsed.kind == "glue-tvt":
        train, val = split_train_val(train)
        splits = {"train": train, "val": val, "test": official_val}
    else:  # in content order: the epoch permutations index the same examples whatever the file order
        splits = {"train": sorted(train, key=example_id), "val": official_val, "test": official_val}
    if parsed.subset is not None:
        splits["train"] = subset(splits["train"], parsed.subset)
    if parsed.task in MISMATCHED_TASKS and has_mismatched(fmt, folder):
        # scored beside test, with the same (best-on-val) weights
        splits[MISMATCHED_SPLIT] = read_split(fmt, folder, parsed.task, MISMATCHED_SPLIT)
    for split, examples in splits.items():
        if not examples:
            raise ConfigError(f"{name}: the {split} split is empty")
    return splits


def example_id(example: Example, salt: str = "") -> str:
    """A stable id of an example: a hash of its texts and label, not of where it sits in a file,
    so a TSV and a JSON Lines copy of one dataset (or a shuffled one) split the same."""
    text = json.dumps([salt, list(example.texts), example.label], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def by_content(examples: list[Example], salt: str) -> list[Example]:
    """The examples in the order of their salted ids: a fixed shuffle that depends on content only."""
    return sorted(examples, key=lambda e: example_id(e, salt))


def split_train_val(examples: list[Example]) -> tuple[list[Example], list[Example]]:
    """Deterministic, disjoint 80/20 split by content (fixed salt, not the run seed); both parts
    in content order, so the epoch permutations index the same examples whatever the file order."""
    ordered = by_content(examples, f"split:{SPLIT_SEED}")
    cut = round(len(ordered) * TRAIN_FRACTION)
    return sorted(ordered[:cut], key=example_id), sorted(ordered[cut:], key=example_id)


def subset(examples: list[Example], size: int) -> list[Example]:
    """The first `size` examples in a fixed order by content (in content order)."""
    return sorted(by_content(examples, f"subset:{SPLIT_SEED}")[:size], key=example_id)


def has_mismatched(fmt: str, folder: Path) -> bool:
    """Whether MNLI's mismatched validation set is there (a copy may hold the matched one only)."""
    if fmt == "tsv":
        return (folder / "dev_mismatched.tsv").is_file()
    if fmt == "jsonl":
        return (folder / "validation_mismatched.jsonl").is_file()
    try:
        return "validation_mismatched" in json.loads((folder / "dataset_dict.json").read_text())["splits"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def read_split(fmt: str, folder: Path, task: str, split: str) -> list[Example]:
    """`split`: train, validation (MNLI: its matched half) or test_mismatched (MNLI only)."""
    spec = TASKS[task]
    mismatched = split == MISMATCHED_SPLIT
    if fmt == "tsv":
        file_name = "train.tsv" if split == "train" else "dev_mismatched.tsv" if mismatched else (
            "dev_matched.tsv" if task == "mnli" else "dev.tsv")  # fmt: skip
        return _read_tsv(folder / file_name, spec)
    if fmt == "jsonl":
        names = ["validation_mismatched.jsonl"] if mismatched else (
            [f"{split}.jsonl"] + (["validation_matched.jsonl"] if task == "mnli" else []))  # fmt: skip
        path = next(
            (folder / n for n in reversed(names) if (folder / n).is_file()), folder / names[0]
        )
        return _rows_to_examples(_read_jsonl(path), spec, str(path))
    saved = "validation_mismatched" if mismatched else split
    return _rows_to_examples(_read_saved_dataset(folder, task, saved), spec, str(folder))


def prompt_text(task: str, texts: tuple[str, ...]) -> str:
    spec = TASKS[task]
    return spec.template.format(*texts) + spec.tail


def _read_tsv(path: Path, spec: TaskSpec) -> list[Example]:
    if not path.is_file():
        raise ConfigError(f"data file not found: {path}")
    with open(path, encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    if spec.name == "cola":  # no header: source, label, original label, sentence
        header, body = [str(i) for i in range(4)], rows
    else:
        header, body = rows[0], rows[1:]
    try:
        text_cols = [header.index(f) for f in spec.tsv_fields]
        label_col = header.index(spec.tsv_label)
    except ValueError:
        raise ConfigError(
            f"{path}: header {header} lacks {(*spec.tsv_fields, spec.tsv_label)}"
        ) from None
    examples = []
    for line_no, row in enumerate(body, start=2):
        if len(row) <= max(*text_cols, label_col):
            continue  # GLUE's TSVs have a few broken lines; the official loaders skip them too
        label = _label(row[label_col], spec, f"{path}:{line_no}")
        examples.append(Example(tuple(row[c] for c in text_cols), label))
    return examples


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ConfigError(f"data file not found: {path}")
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _read_saved_dataset(folder: Path, task: str, split: str) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            f"{folder} is a save_to_disk folder but `datasets` is not installed"
        ) from None
    dataset_dict = datasets.load_from_disk(str(folder))
    names = [split] + (["validation_matched"] if task == "mnli" and split == "validation" else [])
    for candidate in reversed(names):
        if candidate in dataset_dict:
            return [dict(row) for row in dataset_dict[candidate]]
    raise ConfigError(f"{folder} has no {split!r} split (has: {', '.join(dataset_dict)})")


def _rows_to_examples(rows: list[dict[str, Any]], spec: TaskSpec, where: str) -> list[Example]:
    examples = []
    for row in rows:
        missing = [f for f in (*spec.fields, "label") if f not in row]
        if missing:
            raise ConfigError(f"{where}: rows lack field(s) {missing}")
        label = _label(row["label"], spec, where)
        if label >= 0:  # HF test splits carry label -1
            examples.append(Example(tuple(str(row[f]) for f in spec.fields), label))
    return examples


def _label(value: Any, spec: TaskSpec, where: str) -> int:
    text = str(value).strip()
    if spec.label_map is not None and text in spec.label_map:
        return spec.label_map[text]
    try:
        label = int(text)
    except ValueError:
        raise ConfigError(f"{where}: label {text!r} is not valid for {spec.name}") from None
    if label >= len(spec.label_words):
        raise ConfigError(f"{where}: label {label} out of range for {spec.name}")
    return label
