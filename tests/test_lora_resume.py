"""The LoRA worker's data order, checkpoints and resume, on a tiny Llama on CPU: a run stopped
after a checkpoint and resumed (at the same batch, or at half the batch with double the
accumulation, as the ladder retries) gives the losses and scores of a run never stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from workers.lora import train  # noqa: E402
from workers.lora.checkpoint import STATE_FILE  # noqa: E402
from workers.lora.config import ConfigError, parse_config  # noqa: E402
from workers.lora.order import EpochOrder, epoch_permutation  # noqa: E402

pytestmark = pytest.mark.train
STEPS_PER_EPOCH = 96 // 8  # 120 examples, 80 % for training, effective batch 8


class Interrupted(Exception):
    """The death of an attempt, some steps after its last checkpoint."""


# the sample GLUE data of the data_dir fixture (tests/conftest.py): tasks, train and dev examples
SAMPLE_GLUE = ("rte", 120, 40)


def run(run_dir: Path, data_dir: Path, **settings: Any) -> train.TrainOutcome:
    raw = {
        "model": "tiny-llama", "peft": {"r": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]},
        "data": "glue-tvt_rte", "data_dir": str(data_dir), "batch_size": 8, "learning_rate": 0.01,
        "num_epochs": 2, "prec": "fp32", "seed": 3, "no_save": True, "checkpoint_every_steps": 0,
    } | settings  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(yaml.safe_dump(raw))
    return train.run(parse_config(raw, run_dir, {}), run_dir, train.Heartbeat(run_dir), lambda _: None)


def die_at_step(monkeypatch: pytest.MonkeyPatch, step: int, micro_batches_per_step: int) -> None:
    """Make the micro-batch that starts optimizer step `step` raise."""
    real_step, calls = train.train_step, [0]

    def dying_step(*args: Any) -> float:
        calls[0] += 1
        if calls[0] == (step - 1) * micro_batches_per_step + 1:
            raise Interrupted(f"died in step {step}")
        return real_step(*args)

    monkeypatch.setattr(train, "train_step", dying_step)


def test_each_epoch_is_a_permutation_of_seed_and_epoch_alone() -> None:
    first = epoch_permutation(50, seed=1, epoch=0)
    assert sorted(first) == list(range(50))
    assert first == epoch_permutation(50, seed=1, epoch=0)
    assert first != epoch_permutation(50, seed=1, epoch=1) != epoch_permutation(50, seed=0, epoch=1)
    order = EpochOrder(50, seed=1)
    order.set_epoch(1, skip=20)
    assert list(order) == epoch_permutation(50, seed=1, epoch=1)[20:] and len(order) == 30


@pytest.mark.parametrize(
    ("die_at", "resume_batch", "resume_accum", "dropout", "schedule"),
    [
        # checkpoint-12 is the end of epoch 1 (its evaluation not yet run); at half the batch
        (14, 4, 2, 0.0, {}),
        # checkpoint-18 is mid epoch 2; the same batch with LoRA dropout, whose RNG is restored
        (20, 8, 1, 0.1, {}),
        # checkpoint-6 is inside a cosine schedule's warm-up: its position is restored too
        (8, 4, 2, 0.0, {"lr_scheduler": "cosine", "warmup_steps": 8}),
    ],
)
def test_a_run_resumed_from_its_checkpoint_matches_one_never_stopped(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch,
    die_at: int, resume_batch: int, resume_accum: int, dropout: float, schedule: dict[str, Any],
) -> None:  # fmt: skip
    peft = {"r": 8, "alpha": 16, "targets": ["q_proj", "v_proj"], "lora_dropout": dropout}
    whole = run(tmp_path / "whole", data_dir, peft=peft, **schedule)
    assert whole.steps == 2 * STEPS_PER_EPOCH

    first = tmp_path / "attempt-1"
    with monkeypatch.context() as patch:
        die_at_step(patch, die_at, 1)
        with pytest.raises(Interrupted):
            run(first, data_dir, peft=peft, checkpoint_every_steps=6, num_data_workers=1, **schedule)
    saved = sorted(p.name for p in first.iterdir() if p.name.startswith(("checkpoint-", ".checkpoint-")))
    last = (die_at - 1) // 6 * 6
    assert saved == [f"checkpoint-{last}"]  # whole (renamed into place), older ones removed

    resumed = run(tmp_path / "attempt-2", data_dir, peft=peft, batch_size=resume_batch, checkpoint_every_steps=6,
                  gradient_accumulation_steps=resume_accum, resume_from_checkpoint=str(first / f"checkpoint-{last}"),
                  **schedule)
    assert resumed.steps == whole.steps and resumed.samples_seen == whole.samples_seen
    assert resumed.losses == pytest.approx(whole.losses, rel=1e-4)
    assert resumed.best_step == whole.best_step
    # the same predictions, counted; the loss, a sum of log-probabilities, to rounding
    assert without_loss(resumed.metrics) == without_loss(whole.metrics)
    for split in ("val", "test"):
        assert resumed.metrics[split]["loss"] == pytest.approx(whole.metrics[split]["loss"], rel=1e-4)
    assert not list((tmp_path / "attempt-2").glob("checkpoint-*"))  # finished: its checkpoints are gone


def test_a_checkpoint_of_other_settings_is_refused(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = tmp_path / "attempt-1"
    with monkeypatch.context() as patch:
        die_at_step(patch, 5, 1)
        with pytest.raises(Interrupted):
            run(first, data_dir, checkpoint_every_steps=2)
    assert (first / "checkpoint-4" / STATE_FILE).is_file()
    with pytest.raises(ConfigError, match="effective_batch_size"):
        run(tmp_path / "other", data_dir, batch_size=4, resume_from_checkpoint=str(first / "checkpoint-4"))
    with pytest.raises(ConfigError, match="not a checkpoint"):
        run(tmp_path / "none", data_dir, resume_from_checkpoint=str(tmp_path))


def test_a_kill_during_the_removal_of_a_checkpoint_leaves_no_partial_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.lora import checkpoint

    for step in (20, 30):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        for name in ("lora.pt", "optimizer.pt", STATE_FILE):
            (folder / name).write_text("x")
    real_rmtree = checkpoint.shutil.rmtree

    def killed_half_way(path: Path, *args: Any, **kwargs: Any) -> None:
        if Path(path).exists():
            (Path(path) / STATE_FILE).unlink()  # the deletion got this far, then SIGKILL
            raise Interrupted("killed during the final clean-up")

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_half_way)
    with pytest.raises(Interrupted):
        checkpoint.remove_checkpoints(tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert not [name for name in left if checkpoint.CHECKPOINT_NAME.match(name)
                and not (tmp_path / name / STATE_FILE).exists()], left  # every checkpoint-N whole
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    checkpoint.remove_checkpoints(tmp_path)  # the next clean-up takes what the killed one left
    assert list(tmp_path.iterdir()) == []


def test_a_kill_during_the_final_clean_up_leaves_a_succeeded_run(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from tests.lora_runs import run_lora_worker
    from workers.lora import checkpoint

    real_remove = checkpoint.remove_checkpoints

    def killed(run_dir: Path, below_step: int | None = None) -> None:
        if below_step is None:  # the clean-up once the run is over; a save's own removal goes on
            raise Interrupted("SIGKILL during the final clean-up")
        real_remove(run_dir, below_step)

    monkeypatch.setattr(checkpoint, "remove_checkpoints", killed)
    with pytest.raises(Interrupted):
        run_lora_worker(tmp_path / "killed", data_dir, checkpoint_every_steps=1)
    result = json.loads((tmp_path / "killed" / "result.json").read_text())
    assert result["status"] == "succeeded"  # written before the clean-up: the run is not redone
    monkeypatch.undo()
    run_lora_worker(tmp_path / "clean", data_dir, checkpoint_every_steps=1)
    assert not list((tmp_path / "clean").glob("checkpoint-*"))  # finished: removed


def without_loss(metrics: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    return {split: {k: v for k, v in scores.items() if k != "loss"} for split, scores in metrics.items()}
