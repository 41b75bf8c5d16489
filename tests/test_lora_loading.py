"""The model as the LoRA worker meets it. Loading: only a missing path or a bad config is a config
error (never retried); a transient read error is tried again, then fails the attempt as
retryable. Calling: `logits_to_keep` reaches the model under the name its forward takes."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from workers.harness import EXIT_CONFIG_ERROR, EXIT_FAILED, EXIT_OK  # noqa: E402
from workers.lora import model as lora_model  # noqa: E402
from workers.lora.__main__ import main  # noqa: E402

pytestmark = pytest.mark.train


# the sample GLUE data of the data_dir fixture (tests/conftest.py): tasks, train and dev examples
SAMPLE_GLUE = ("rte", 16, 8)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lora_model.save_tiny_llama(tmp_path_factory.mktemp("tiny") / "model")


def run(run_dir: Path, data_root: Path, model: Path) -> tuple[int, dict[str, Any]]:
    config = {"model": str(model), "peft": {"r": 2, "targets": ["q_proj"]}, "data": "glue-tvt_rte",
              "data_dir": str(data_root), "batch_size": 8, "max_steps": 1, "prec": "fp32", "no_save": True}  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    code = main(["--run-dir", str(run_dir)])
    return code, json.loads((run_dir / "result.json").read_text())


def flaky_from_pretrained(
    monkeypatch: pytest.MonkeyPatch, failures: int, exc: OSError
) -> list[int]:
    real = transformers.AutoModelForCausalLM.from_pretrained
    calls: list[int] = []

    def from_pretrained(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= failures:
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(lora_model, "LOAD_RETRY_WAITS_S", (0.0, 0.0))
    return calls


def test_a_transient_read_error_is_tried_again(
    tmp_path: Path, data_dir: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    calls = flaky_from_pretrained(monkeypatch, 1, OSError(errno.EIO, "Input/output error"))
    code, result = run(tmp_path, data_dir, model_dir)
    assert (code, result["status"], len(calls)) == (EXIT_OK, "succeeded", 2)
    assert (
        "reading the model failed ([Errno 5] Input/output error); trying again"
        in capsys.readouterr().err
    )


def test_a_read_error_that_persists_fails_as_retryable_not_as_a_config_error(
    tmp_path: Path, data_dir: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = flaky_from_pretrained(monkeypatch, 99, OSError(errno.ESTALE, "Stale file handle"))
    code, result = run(tmp_path, data_dir, model_dir)
    assert (code, result["status"], len(calls)) == (EXIT_FAILED, "failed", 3)
    assert result["error"] == (
        f"ModelLoadError: cannot read model from {model_dir} (tried 3 times): [Errno 116] Stale file handle"
    )


@pytest.mark.parametrize("broken", ["weights", "config"])
def test_a_missing_file_or_a_bad_config_is_a_config_error(
    tmp_path: Path, data_dir: Path, model_dir: Path, broken: str
) -> None:
    copy = tmp_path / "model"
    copy.mkdir()
    for item in model_dir.iterdir():
        (copy / item.name).write_bytes(item.read_bytes())
    if broken == "weights":
        (copy / "model.safetensors").unlink()
    else:
        (copy / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    code, result = run(tmp_path / "run", data_dir, copy)
    assert (code, result["status"]) == (EXIT_CONFIG_ERROR, "config_error")
    assert result["error"].startswith(f"cannot load model from {copy}: ")


class _Output:
    def __init__(self, logits: Any) -> None:
        self.logits = logits


class OldLlama(torch.nn.Module):  # transformers 4.45-4.49 named it num_logits_to_keep
    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, Any] = {}
    def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any = None,
                num_logits_to_keep: int = 0) -> _Output:  # fmt: skip
        self.seen = {"num_logits_to_keep": num_logits_to_keep}
        return _Output(torch.zeros(input_ids.shape[0], input_ids.shape[1], 5))


class NoKeep(OldLlama):

    def forward(  # type: ignore[override]
        self, input_ids: Any, attention_mask: Any, position_ids: Any = None
    ) -> _Output:
        return _Output(torch.zeros(input_ids.shape[0], input_ids.shape[1], 5))


def test_logits_to_keep_is_passed_under_the_name_the_model_takes() -> None:
    from workers.lora import train

    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 3),
             "position_ids": torch.zeros(2, 3, dtype=torch.long)}  # fmt: skip
    old = OldLlama()
    assert train.answer_logits(old, batch, 1, "llama").shape == (2, 5)
    assert old.seen == {"num_logits_to_keep": 1}
    assert train.logits_to_keep_argument(NoKeep()) is None
    assert train.answer_logits(NoKeep(), batch, 1, "llama").shape == (
        2,
        5,
    )  # nothing unknown passed
    tiny, _ = lora_model.build_tiny_llama()
    assert train.logits_to_keep_argument(tiny) == "logits_to_keep"


def test_a_model_without_logits_to_keep_is_warned_of(
    tmp_path: Path, data_dir: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from workers.lora import train

    monkeypatch.setattr(train, "logits_to_keep_argument", lambda model: None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({
        "model": "tiny-llama", "data": "glue-tvt_rte", "data_dir": str(data_dir), "max_steps": 1,
        "prec": "fp32", "no_save": True, "logits_to_keep": 1,
    }))  # fmt: skip
    assert main(["--run-dir", str(run_dir)]) == EXIT_OK
    assert (
        "logits_to_keep: 1 has no effect: this model's forward takes neither"
        in capsys.readouterr().err
    )
