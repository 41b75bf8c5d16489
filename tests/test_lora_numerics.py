"""The LoRA worker's numbers a reviewer can trust: a diverged run fails naming its step, the
gradient is clipped after accumulation, the schedule is HF's, and every JSON it writes is valid."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from workers.harness import EXIT_FAILED, Heartbeat, write_result  # noqa: E402
from workers.lora import train  # noqa: E402
from workers.lora.__main__ import main  # noqa: E402
from workers.lora.config import ConfigError, parse_config  # noqa: E402
from workers.lora.optimizer import lr_factor  # noqa: E402

pytestmark = pytest.mark.train


def strict_json(text: str) -> Any:
    def refuse(token: str) -> float:
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


# the sample GLUE data of the data_dir fixture (tests/conftest.py): tasks, train and dev examples
SAMPLE_GLUE = ("rte", 40, 16)


def config_dict(data_root: Path, **overrides: Any) -> dict[str, Any]:
    return {
        "model": "tiny-llama", "peft": {"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj", "lm_head"]},
        "data": "glue-tvt_rte", "data_dir": str(data_root), "batch_size": 8,
        "learning_rate": 0.01, "num_epochs": 1, "prec": "fp32", "seed": 1, "no_save": True,
    } | overrides  # fmt: skip


def write_config(run_dir: Path, data_root: Path, **overrides: Any) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_dict(data_root, **overrides)))
    return run_dir


def test_a_blown_up_learning_rate_fails_naming_the_step(tmp_path: Path, data_dir: Path) -> None:
    run_dir = write_config(tmp_path, data_dir, learning_rate=1e6, num_epochs=3)
    assert main(["--run-dir", str(run_dir)]) == EXIT_FAILED
    result = strict_json((run_dir / "result.json").read_text())
    assert result["status"] == "failed"
    assert result["error"].startswith("NonFiniteLoss: ")
    assert "at optimizer step " in result["error"] and " of 12" in result["error"]
    for line in (run_dir / "progress.jsonl").read_text().splitlines():
        strict_json(line)


def test_a_nan_loss_fails_at_its_step_even_without_clipping(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_step = train.train_step
    calls: list[int] = []

    def nan_on_third_micro_batch(*args: Any) -> float:
        calls.append(1)
        loss = real_step(*args)
        return math.nan if len(calls) == 3 else loss

    monkeypatch.setattr(train, "train_step", nan_on_third_micro_batch)
    run_dir = write_config(tmp_path, data_dir, max_grad_norm=0, batch_size=4,
                           gradient_accumulation_steps=2)  # fmt: skip
    assert main(["--run-dir", str(run_dir)]) == EXIT_FAILED
    result = strict_json((run_dir / "result.json").read_text())
    assert result["error"] == (
        "NonFiniteLoss: loss is nan at optimizer step 2 of 4: the run diverged "
        "(lower learning_rate, or add warm-up)"
    )


def test_the_gradient_is_clipped_once_per_accumulated_group(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    norms: dict[tuple[int, int], list[float]] = {}
    real_clip = torch.nn.utils.clip_grad_norm_
    for batch, accum in ((8, 1), (4, 2)):
        seen = norms.setdefault((batch, accum), [])

        def spy(
            params: Any, max_norm: float, *args: Any, _seen: list[float] = seen, **kwargs: Any
        ) -> Any:
            assert max_norm == 0.5
            total = real_clip(params, max_norm, *args, **kwargs)
            _seen.append(float(total))
            return total

        monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
        raw = config_dict(data_dir, batch_size=batch, gradient_accumulation_steps=accum,
                          max_grad_norm=0.5, learning_rate=0.05)  # fmt: skip
        outcome = train.run(parse_config(raw, tmp_path, {}), tmp_path, Heartbeat(tmp_path), print)
        assert outcome.steps == len(seen) == 4  # one clip per optimizer step, not per micro-batch
    assert norms[(4, 2)] == pytest.approx(norms[(8, 1)], rel=1e-4)  # the group's norm: ladder-proof
    assert max(norms[(8, 1)]) > 0.5  # the clip did act


def test_schedules_follow_hf_trainer() -> None:
    # 10 updates, 2 of warm-up: 0, 0.5, then constant / linear / cosine down from 1
    assert [lr_factor(s, 10, 2, "constant") for s in range(4)] == [0.0, 0.5, 1.0, 1.0]
    assert [lr_factor(s, 10, 2, "linear") for s in (2, 6, 10)] == [1.0, 0.5, 0.0]
    assert [lr_factor(s, 10, 2, "cosine") for s in (2, 6, 10)] == pytest.approx([1.0, 0.5, 0.0])
    assert lr_factor(0, 10, 0, "linear") == 1.0


def test_optimizer_keys_and_defaults(tmp_path: Path, data_dir: Path) -> None:
    defaults = parse_config(config_dict(data_dir), tmp_path, {})
    assert (defaults.weight_decay, defaults.lr_scheduler, defaults.warmup_steps,
            defaults.warmup_ratio, defaults.max_grad_norm) == (0.01, "constant", 0, 0.0, 1.0)  # fmt: skip
    chosen = parse_config(config_dict(data_dir, weight_decay=0, lr_scheduler="Cosine", warmup_ratio=0.1,
                                      max_grad_norm=None), tmp_path, {})  # fmt: skip
    assert (chosen.weight_decay, chosen.lr_scheduler, chosen.warmup_ratio, chosen.max_grad_norm) == (
        0.0, "cosine", 0.1, 0.0)  # fmt: skip
    for bad in ({"lr_scheduler": "polynomial"}, {"warmup_ratio": 2}, {"weight_decay": -1},
                {"max_grad_norm": "big"}, {"learning_rate": float("inf")}):  # fmt: skip
        with pytest.raises(ConfigError):
            parse_config(config_dict(data_dir, **bad), tmp_path, {})


def test_warmup_and_linear_decay_reach_the_optimizer(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_HEARTBEAT_S", "0")  # a heartbeat every step
    raw = config_dict(data_dir, lr_scheduler="linear", warmup_steps=2, learning_rate=0.01)
    train.run(parse_config(raw, tmp_path, {}), tmp_path, Heartbeat(tmp_path), print)
    beats = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    rates = [b["lr"] for b in beats if "lr" in b]
    # 4 updates: warm-up 0, 0.005, then linear decay over the remaining 2 (1.0, 0.5)
    assert rates == pytest.approx([0.0, 0.005, 0.01, 0.005])
    assert all(b["grad_norm"] > 0 for b in beats if "lr" in b)


def test_json_the_worker_writes_is_valid(tmp_path: Path) -> None:
    write_result(tmp_path, "failed", final_loss=math.nan, metrics={"val": {"accuracy": math.inf}})
    result = strict_json((tmp_path / "result.json").read_text())
    assert result["final_loss"] is None and result["metrics"] == {"val": {"accuracy": None}}
    Heartbeat(tmp_path).beat(3, 10, -math.inf, None, None, val={"f1": math.nan})
    (beat,) = [strict_json(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert beat["loss"] is None and beat["val"] == {"f1": None}


def test_the_ladder_with_lora_dropout_on(tmp_path: Path, data_dir: Path) -> None:
    """What each rung keeps when LoRA dropout is on. Each mask is keyed by (seed, step,
    micro-batch, module) and drawn in the micro-batch's full sequence shape, so checkpointing's
    recomputation and logits_to_keep's one-position lm_head input read the same masks; a halved
    micro-batch is other data in each forward, so it draws other masks: the run is then
    statistically equal to the original, not bit-equal."""
    peft = {"r": 8, "alpha": 16, "dropout": 0.2, "targets": ["q_proj", "v_proj", "lm_head"]}

    def losses(**overrides: Any) -> list[float]:
        raw = config_dict(data_dir, peft=peft, **overrides)
        return train.run(
            parse_config(raw, tmp_path, {}), tmp_path, Heartbeat(tmp_path), print
        ).losses

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    as_configured = losses()
    assert len(as_configured) == 4
    assert losses() == as_configured  # a retry at the same level: the same draws, bit for bit
    assert losses(gradient_checkpointing=True) == as_configured
    # fp32 here: lm_head's matmul over one position rounds apart from the one over all positions
    # (bf16 is bit-equal: tests/test_lora_equivalence.py); a redrawn mask would move it by > 1e-2
    assert losses(logits_to_keep=1) == pytest.approx(as_configured, rel=1e-5)
    redrawn = losses(batch_size=4, gradient_accumulation_steps=2)
    # the first update is the same (LoRA's B starts at zero: no dropout draw can act yet);
    # then the masks differ: a halved micro-batch draws its own
    assert redrawn[0] == pytest.approx(as_configured[0], abs=1e-5)
    assert max(abs(a - b) for a, b in zip(redrawn, as_configured, strict=True)) > 1e-2
    # statistically equal: the run's mean loss moves by far less than it spans over seeds
    assert mean(redrawn) == pytest.approx(mean(as_configured), rel=0.02)
