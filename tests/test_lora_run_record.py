"""What the LoRA worker records beside its scores: truncation field by field (counted per split,
warned above 1 %), MNLI's mismatched set scored beside matched, MRPC/QQP accuracy beside F1,
and the loss summary the divergence rule reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from lora_runs import run_lora_worker

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from orchestrator.attempts.divergence import summary_from_record  # noqa: E402
from orchestrator.executors.provenance import hash_files  # noqa: E402
from workers.lora.batching import encode_counted, field_caps  # noqa: E402
from workers.lora.data import Example, prompt_text  # noqa: E402
from workers.lora.model import build_tiny_tokenizer  # noqa: E402

pytestmark = pytest.mark.train

SAMPLE_GLUE = ("rte,mnli,mrpc", 24, 8)


def test_field_caps_shorten_the_longest_field_first_and_never_drop_one() -> None:
    assert field_caps([100, 20], 50) == [30, 20]  # only the long premise loses tokens
    assert field_caps([30, 30], 50) == [25, 25]  # equal fields shorten evenly
    assert field_caps([5, 100, 3], 20) == [5, 12, 3]
    assert field_caps([10, 10], 1) == [1, 1]  # over budget rather than a field dropped
    assert field_caps([40, 8], 60) == [40, 8]  # fits: untouched


def test_a_long_premise_keeps_the_hypothesis_and_the_question() -> None:
    tokenizer = build_tiny_tokenizer()
    premise = " ".join(["the dog"] * 80)
    hypothesis = "a cat near the red house"  # the tiny vocabulary has no "near": one token less
    short = Example(("a dog", "a cat"), 0)
    encoded, truncated = encode_counted(tokenizer, "rte", [Example((premise, hypothesis), 0), short], 48)
    assert truncated == 1
    assert len(encoded[0].input_ids) <= 48
    text = " ".join(tokenizer.decode(encoded[0].input_ids).replace(":", " : ").split())
    assert text.startswith("sentence 1 : the dog the dog"), text  # the premise's head is kept
    assert "sentence 2 : a cat the red house does sentence 1 entail sentence 2 ? answer :" in text, text
    assert encoded[1].input_ids == list(tokenizer(prompt_text("rte", short.texts))["input_ids"])


def run_worker(run_dir: Path, data_root: Path, **overrides: Any) -> dict[str, Any]:
    return run_lora_worker(run_dir, data_root, **{"max_steps": 3} | overrides)


def test_truncation_is_counted_per_split_and_warned(
    tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short = run_worker(tmp_path / "short", data_dir, max_seq_len=20)
    assert short["examples"] == {"train": 19, "val": 5, "test": 8}  # 24 split 80/20 by content
    assert all(short["truncated"][split] > 0 for split in ("train", "val", "test")), short["truncated"]
    assert "lost text from their longest field" in capsys.readouterr().err
    roomy = run_worker(tmp_path / "roomy", data_dir, max_seq_len=256)
    assert roomy["truncated"] == {"train": 0, "val": 0, "test": 0}
    assert "lost text" not in capsys.readouterr().err
    # its own provenance: versions, the model, and a hash of the data's content wherever it lies
    provenance = roomy["provenance"]
    assert provenance["recorded_by"] == "workers.lora" and provenance["model"] == {"builtin": "tiny-llama"}
    assert provenance["libraries"]["torch"] == str(torch.__version__)
    assert "cuda_runtime" in provenance
    copy = tmp_path / "copy"
    shutil.copytree(data_dir / "RTE", copy)
    assert provenance["data"]["sha256"] == hash_files(list(copy.iterdir()), copy)["sha256"]
    assert set(provenance["data"]["files"]) == {"train.tsv", "dev.tsv"}


def test_mnli_scores_matched_and_mismatched_and_mrpc_accuracy_and_f1(tmp_path: Path, data_dir: Path) -> None:
    mnli = run_worker(tmp_path / "mnli", data_dir, data="glue-tvt_mnli")
    test = mnli["metrics"]["test"]
    assert {"accuracy", "accuracy_mismatched"} <= set(test)
    assert mnli["examples"]["test_mismatched"] == 8
    mrpc = run_worker(tmp_path / "mrpc", data_dir, data="glue-tvt_mrpc")
    assert {"accuracy", "f1"} <= set(mrpc["metrics"]["test"]) and {"accuracy", "f1"} <= set(mrpc["metrics"]["val"])


def test_the_loss_summary_is_written_from_the_step_losses(tmp_path: Path, data_dir: Path) -> None:
    """6 steps of 3 per epoch (19 examples, batch 8): the first step's loss (a window of one
    step for so short a run), the lowest step and the mean of the last epoch's three."""
    result = run_worker(tmp_path, data_dir, learning_rate=0.001, max_steps=6, checkpoint_every_steps=0)
    summary = summary_from_record(result["loss_summary"])
    assert summary is not None and (summary.steps, summary.final_steps) == (6, 3)
    beats = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    first = next(b["loss"] for b in beats if b["step"] == 1 and b.get("loss") is not None)
    assert summary.initial == pytest.approx(first)
    assert summary.minimum is not None and summary.minimum <= summary.initial
    assert summary.final is not None and not summary.nonfinite
