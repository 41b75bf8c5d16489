"""Evaluation in the LoRA worker: it beats while it runs (a long validation must not look hung),
at a larger batch of prompts sorted by length, with scores that do not depend on that batch."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from workers.harness import Heartbeat  # noqa: E402
from workers.lora import train  # noqa: E402
from workers.lora.batching import LeftPadCollator, answer_token_ids, encode  # noqa: E402
from workers.lora.config import parse_config  # noqa: E402
from workers.lora.data import load_splits  # noqa: E402
from workers.lora.model import apply_lora, build_tiny_llama  # noqa: E402

pytestmark = pytest.mark.train


# the sample GLUE data of the data_dir fixture (tests/conftest.py): tasks, train and dev examples
SAMPLE_GLUE = ("rte", 40, 24)


def config(data_root: Path, **overrides: Any) -> Any:
    raw = {"model": "tiny-llama", "peft": {"r": 4, "targets": ["q_proj", "v_proj"]},
           "data": "glue-tvt_rte", "data_dir": str(data_root), "batch_size": 4, "max_steps": 2,
           "learning_rate": 0.01, "prec": "fp32", "seed": 1, "no_save": True} | overrides  # fmt: skip
    return parse_config(raw, data_root, {})


def test_evaluation_beats_and_runs_at_a_larger_batch_longest_first(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_HEARTBEAT_S", "0")  # beat whenever there is something to say
    loaders: list[Any] = []
    real_build = train.build_loader

    def spy(encoded: list[Any], batch_size: int, *args: Any) -> Any:
        loaders.append((encoded, batch_size, args[2] is not None))  # args[2]: the epoch order, None for eval
        return real_build(encoded, batch_size, *args)

    monkeypatch.setattr(train, "build_loader", spy)
    train.run(config(data_dir), tmp_path, Heartbeat(tmp_path), print)
    beats = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    # 24 dev examples are the test split; 8 train examples of 40 are val: at batch 8, 3 and 1
    assert [(b["eval_split"], b["eval_batches_done"], b["eval_batches"]) for b in beats if "eval_split" in b] == [
        ("val", 1, 1), ("test", 1, 3), ("test", 2, 3), ("test", 3, 3)
    ]  # fmt: skip
    evals = [(encoded, size) for encoded, size, shuffle in loaders if not shuffle]
    assert [size for _, size in evals] == [8, 8]  # 2 x batch_size
    for encoded, _ in evals:
        lengths = [len(e.input_ids) for e in encoded]
        assert lengths == sorted(lengths, reverse=True) and len(set(lengths)) > 1

    loaders.clear()
    train.run(config(data_dir, eval_batch_size=5), tmp_path, Heartbeat(tmp_path), print)
    assert [size for _, size, shuffle in loaders if not shuffle] == [5, 5]


def test_scores_do_not_depend_on_the_eval_batch(data_dir: Path) -> None:
    model, tokenizer = build_tiny_llama()
    model, _ = apply_lora(model, {"r": 4, "target_modules": ["q_proj", "v_proj", "lm_head"],
                                  "init_lora_weights": False}, "llama")  # fmt: skip
    answer_ids = answer_token_ids(tokenizer, "rte")
    encoded = encode(tokenizer, "rte", load_splits("glue_rte", data_dir)["test"], 64)
    collator = LeftPadCollator(tokenizer.pad_token_id, answer_ids)
    scores = []
    for batch, ordered in ((1, encoded), (16, sorted(encoded, key=lambda e: -len(e.input_ids)))):
        loader = train.build_loader(ordered, batch, collator, 0, None, 0)
        scores.append(train.evaluate(model, loader, answer_ids, "rte", "llama", torch.device("cpu"),
                                     contextlib.nullcontext))  # fmt: skip
    losses = [s.pop("loss") for s in scores]
    assert scores[0] == scores[1]
    assert 0.0 < scores[0]["accuracy"] < 1.0  # a random LoRA: both classes are predicted
    # the loss is a sum of floats: batched differently, it agrees to rounding
    assert losses[0] == pytest.approx(losses[1], rel=1e-5) and losses[0] > 0


def test_a_checkpoint_is_taken_before_test_is_scored_and_a_resume_from_it_only_scores_test(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []
    real_evaluate = train.evaluate

    def spy(*args: Any) -> Any:
        seen.append(sorted(p.name for p in tmp_path.glob("checkpoint-*")))
        return real_evaluate(*args)

    monkeypatch.setattr(train, "evaluate", spy)
    first = train.run(config(data_dir, checkpoint_every_steps=100), tmp_path, Heartbeat(tmp_path), print)
    assert seen == [[], ["checkpoint-2"]]  # val after the last step, then test with the final state on disk
    assert not list(tmp_path.glob("checkpoint-*"))  # finished: removed

    # an attempt that died while scoring test resumes at the last step: it scores test alone
    saved = tmp_path / "saved"
    real_save = train.save_checkpoint
    monkeypatch.setattr(train, "save_checkpoint", lambda run_dir, *a: real_save(saved, *a))
    saved.mkdir()
    train.run(config(data_dir, checkpoint_every_steps=100), tmp_path, Heartbeat(tmp_path), print)
    seen.clear()
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    again = train.run(config(data_dir, checkpoint_every_steps=100, resume_from_checkpoint=str(saved / "checkpoint-2")),
                      resumed_dir, Heartbeat(resumed_dir), print)
    assert len(seen) == 1 and again.steps == 2
    assert again.metrics["test"] == pytest.approx(first.metrics["test"])
