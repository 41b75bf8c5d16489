"""The LoRA worker end to end on a tiny Llama on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from workers.harness import EXIT_CONFIG_ERROR, EXIT_OOM  # noqa: E402
from workers.lora import train  # noqa: E402
from workers.lora.__main__ import main  # noqa: E402
from workers.lora.batching import LeftPadCollator, answer_token_ids, encode  # noqa: E402
from workers.lora.config import parse_config  # noqa: E402
from workers.lora.data import load_splits  # noqa: E402
from workers.lora.model import apply_lora, build_tiny_llama, is_checkpointing, save_tiny_llama  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.train


# the sample GLUE data of the data_dir fixture (tests/conftest.py): tasks, train and dev examples
SAMPLE_GLUE = ("rte,mrpc", 120, 40)


def write_config(run_dir: Path, data_root: Path, **overrides: Any) -> Path:
    config = {
        "model": "tiny-llama", "peft": {"r": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]},
        "data": "glue-tvt_rte", "data_dir": str(data_root), "batch_size": 16,
        "learning_rate": 0.01, "num_epochs": 3, "prec": "fp32", "seed": 1, "no_save": True,
    } | overrides  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return run_dir / "config.yaml"


def read_result(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "result.json").read_text())


def test_end_to_end_subprocess_with_local_model_dir(tmp_path: Path, data_dir: Path) -> None:
    model_dir = save_tiny_llama(tmp_path / "tiny-model")
    run_dir = tmp_path / "run"
    write_config(
        run_dir, data_dir, model=str(model_dir), no_save=False, data="glue_mrpc", mem_gib=2
    )
    env = {k: v for k, v in os.environ.items() if k != "ORCH_HEARTBEAT_S"} | {
        "PYTHONPATH": str(REPO),
        "ORCH_WORKER_DEVICE": "cpu",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "workers.lora", "--config", str(run_dir / "config.yaml"), "--run-dir", str(run_dir)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "unknown config key" not in proc.stderr  # orch's own keys are not the worker's mistake
    result = read_result(run_dir)
    assert result["status"] == "succeeded"
    assert set(result["metrics"]) == {"val", "test"}
    assert {"accuracy", "f1"} <= set(result["metrics"]["test"])
    assert result["steps"] == 3 * 8  # 120 train / batch 16 -> 8 steps per epoch
    assert result["peak_mem_kind"] == "cpu_peak_rss" and result["peak_mem_mib"] > 0
    assert result["samples_per_s"] > 0
    beats = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    train_beats = [b for b in beats if b["loss"] is not None]
    assert train_beats[-1]["total"] == 24
    # a line per optimizer step (not on the ORCH_HEARTBEAT_S timer), with its learning rate and grad norm
    assert [b["step"] for b in train_beats] == list(range(1, 25))
    assert all(b["lr"] > 0 and b["grad_norm"] is not None for b in train_beats)
    assert all(b["peak_mem_mib"] > 0 for b in beats)
    assert sum("val" in b for b in beats) == 3  # one evaluation per epoch
    assert (run_dir / "adapter" / "adapter_config.json").is_file()


def test_loss_decreases_and_task_is_learnt(tmp_path: Path, data_dir: Path) -> None:
    config = parse_config(
        yaml.safe_load(
            write_config(
                tmp_path,
                data_dir,
                num_epochs=6,
                peft={"r": 8, "target_modules": ["q_proj", "v_proj", "lm_head"]},
            ).read_text()
        ),
        tmp_path,
        {},
    )
    outcome = train.run(config, tmp_path, train.Heartbeat(tmp_path), lambda _: None)
    first, last = sum(outcome.losses[:3]) / 3, sum(outcome.losses[-3:]) / 3
    assert last < 0.8 * first
    assert outcome.metrics["test"]["accuracy"] >= 0.8


def test_batch_times_accumulation_keeps_steps_and_updates(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaders: list[Any] = []
    checkpointing: list[bool] = []
    real_build, real_step = train.build_loader, train.train_step

    def spy_build(*args: Any, **kwargs: Any) -> Any:
        loaders.append(real_build(*args, **kwargs))
        return loaders[-1]

    def spy_step(model: Any, *args: Any) -> float:
        checkpointing.append(is_checkpointing(model))
        return real_step(model, *args)

    monkeypatch.setattr(train, "build_loader", spy_build)
    monkeypatch.setattr(train, "train_step", spy_step)
    outcomes = []
    # 2 epochs: the order of the second must not depend on the loader's workers either
    for batch, accum, workers, ckpt in ((8, 1, 1, False), (4, 2, 0, True)):
        raw = yaml.safe_load(write_config(tmp_path, data_dir, num_epochs=2, batch_size=batch,
                                          gradient_accumulation_steps=accum, num_data_workers=workers,
                                          gradient_checkpointing=ckpt).read_text())  # fmt: skip
        outcomes.append(
            train.run(parse_config(raw, tmp_path, {}), tmp_path, train.Heartbeat(tmp_path), print)
        )
    plain, accumulated = outcomes
    assert plain.steps == accumulated.steps == 2 * 96 // 8
    assert plain.samples_seen == accumulated.samples_seen == 2 * 96
    assert accumulated.losses == pytest.approx(plain.losses, rel=1e-4)  # same updates, same order
    assert [loader.num_workers for loader in loaders[::3]] == [1, 0]  # train loader of each run
    assert len(checkpointing) == 24 + 48  # micro-batches: 24 of 8, then 48 of 4
    assert not any(checkpointing[:24]) and all(checkpointing[24:])


def test_logits_to_keep_gives_the_full_logits_loss(data_dir: Path) -> None:
    model, tokenizer = build_tiny_llama()
    model, _ = apply_lora(
        model, {"r": 4, "target_modules": ["q_proj", "v_proj"], "init_lora_weights": False}, "llama"
    )
    answer_ids = answer_token_ids(tokenizer, "rte")
    examples = load_splits("glue_rte", data_dir)["train"][:6]
    batch = LeftPadCollator(tokenizer.pad_token_id, answer_ids)(
        encode(tokenizer, "rte", examples, 64)
    )
    assert batch["attention_mask"][:, 0].min() == 0 or len({len(e.texts[0]) for e in examples}) == 1
    losses = {}
    for keep in (0, 1, 3):
        logits = train.answer_logits(model, batch, keep, "llama")
        losses[keep] = torch.nn.functional.cross_entropy(logits, batch["target_ids"])
    assert losses[1].item() == pytest.approx(losses[0].item(), abs=1e-6)
    assert losses[3].item() == pytest.approx(losses[0].item(), abs=1e-6)


def test_oom_in_a_step_reports_oom(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def out_of_memory(*_: Any) -> float:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(train, "train_step", out_of_memory)
    write_config(tmp_path, data_dir)
    assert main(["--run-dir", str(tmp_path)]) == EXIT_OOM
    result = read_result(tmp_path)
    assert result["status"] == "oom" and "CUDA out of memory" in result["error"]
    assert result["peak_mem_mib"] > 0


def test_other_exceptions_report_failed(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: Any) -> float:
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(train, "train_step", broken)
    write_config(tmp_path, data_dir)
    assert main(["--run-dir", str(tmp_path)]) == 1
    assert read_result(tmp_path) | {"error": "RuntimeError: shape mismatch"} == read_result(
        tmp_path
    )
    assert read_result(tmp_path)["status"] == "failed"


@pytest.mark.parametrize("problem", ["model", "data_dir", "task"])
def test_config_errors_exit_4(
    tmp_path: Path, data_dir: Path, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = {"model": {"model": str(tmp_path / "no-model")}, "data_dir": {"data_dir": str(tmp_path / "no-data")},
           "task": {"data": "glue_stsb"}}[problem]  # fmt: skip
    write_config(tmp_path / "run", data_dir, **bad)
    assert main(["--run-dir", str(tmp_path / "run")]) == EXIT_CONFIG_ERROR
    result = read_result(tmp_path / "run")
    assert result["status"] == "config_error"
    stderr_lines = [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("config error")
    ]
    assert len(stderr_lines) == 1 and result["error"] in stderr_lines[0]


def test_gla_model_without_fla_is_a_config_error(tmp_path: Path, data_dir: Path) -> None:
    if "fla" in sys.modules or __import__("importlib").util.find_spec("fla") is not None:
        pytest.skip("fla is installed here")
    model_dir = tmp_path / "gla"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "gla"}))
    write_config(tmp_path / "run", data_dir, model=str(model_dir))
    assert main(["--run-dir", str(tmp_path / "run")]) == EXIT_CONFIG_ERROR
    assert "flash-linear-attention" in read_result(tmp_path / "run")["error"]


def test_memory_benchmark_smoke(tmp_path: Path) -> None:
    from benchmarks.lora_memory import main as benchmark_main

    out = tmp_path / "bench.json"
    argv = [
        "--device",
        "cpu",
        "--tiny",
        "--models",
        "llama",
        "--batches",
        "2",
        "--steps",
        "1",
        "--warmup",
        "0",
    ]
    assert benchmark_main([*argv, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["gradient_checkpointing"], r["logits_to_keep"]) for r in rows] == [
        (False, 0), (True, 0), (False, 1), (True, 1)
    ]  # fmt: skip
    assert all(
        r["status"] == "ok" and r["peak_rss_mib"] > 0 and r["samples_per_s"] > 0 for r in rows
    )
