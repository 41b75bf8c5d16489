"""What the LoRA worker's result.json says about how its numbers were made, and that orch's
reader keeps it: the test-is-validation flag, the effective LoRA settings, the optimizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lora_runs import run_lora_worker
from run_dirs import private_attempt_dir

from orchestrator.attempts.rundir_reads import read_result

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")


pytestmark = pytest.mark.train


# the sample GLUE data of the data_dir fixture (tests/conftest.py): tasks, train and dev examples
SAMPLE_GLUE = ("rte", 24, 8)


@pytest.mark.parametrize(("data", "flag"), [("glue_rte", True), ("glue-tvt_rte", False)])
def test_test_is_val_is_written_and_read_back(
    tmp_path: Path, data_dir: Path, data: str, flag: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = private_attempt_dir(tmp_path)
    written = run_lora_worker(run_dir, data_dir, data=data)
    assert written["test_is_val"] is flag
    assert read_result(run_dir)["test_is_val"] is flag  # type: ignore[index]
    assert ("result.json says test_is_val" in capsys.readouterr().err) is flag


def test_reader_keeps_only_a_boolean_test_is_val_and_a_dropout_probability(tmp_path: Path) -> None:
    run_dir = private_attempt_dir(tmp_path)
    written = {"status": "succeeded", "test_is_val": "yes", "lora_dropout": 2}
    (run_dir / "result.json").write_text(json.dumps(written))
    problems: list[str] = []
    result = read_result(run_dir, problems)
    assert result is not None and "test_is_val" not in result and "lora_dropout" not in result
    assert problems == [
        "result.json: test_is_val must be true or false, not 'yes'",
        "result.json: lora_dropout must be a number from 0 to 1 or null, not 2",
    ]
    (run_dir / "result.json").write_text(json.dumps(written | {"lora_dropout": 0.05}))
    assert read_result(run_dir)["lora_dropout"] == 0.05  # type: ignore[index]


def test_effective_lora_settings_and_optimizer_are_recorded(
    tmp_path: Path,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ORCH_LORA_R", "2")  # once overrode the spec silently; now only warned of
    monkeypatch.setenv("ORCH_LORA_DROPOUT", "0.5")
    peft = {"r": 4, "alpha": 8, "dropout": 0.1, "targets": ["layers.1.attn.q_proj", "attn.v_proj"]}
    run_dir = private_attempt_dir(tmp_path)
    result = run_lora_worker(run_dir, data_dir, peft=peft, weight_decay=0, lr_scheduler="cosine",
                             warmup_ratio=0.5)  # fmt: skip
    assert result["lora"] == {
        "r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": ["q_proj", "v_proj"],
        "layers_to_transform": None, "use_dora": False, "use_rslora": False, "bias": "none",
        "modules_to_save": None, "exclude_modules": None,
    }  # fmt: skip
    assert result["lora_dropout"] == 0.1
    assert result["dropout_masks"].startswith("keyed by (seed, optimizer step, micro-batch, module)")
    assert (result["prec"], result["batch_size"], result["gradient_accumulation_steps"]) == ("fp32", 8, 1)
    assert (result["effective_batch_size"], result["gradient_checkpointing"], result["logits_to_keep"],
            result["num_data_workers"]) == (8, False, 0, 0)  # fmt: skip
    # q_proj and v_proj (32 -> 32) in 2 layers at r=4: 4 x (4x32 + 32x4) parameters
    assert result["trainable_params"] == 4 * (4 * 32 + 32 * 4)
    assert result["total_params"] > 10 * result["trainable_params"]
    assert result["optimizer"] == {
        "name": "AdamW", "learning_rate": 0.01, "betas": [0.9, 0.999], "eps": 1e-8,
        "weight_decay": 0.0, "lr_scheduler": "cosine", "warmup_steps": 1, "total_steps": 2,
        "max_grad_norm": 1.0,
    }  # fmt: skip
    err = capsys.readouterr().err
    assert "ORCH_LORA_R is not read" in err and "ORCH_LORA_DROPOUT is not read" in err
