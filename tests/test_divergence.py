"""The divergence rule: a last epoch above the first steps, above k × the minimum, or not finite."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from orchestrator.attempts.divergence import (
    LossSummary,
    LossTrack,
    summarise_losses,
    summary_from_record,
    verdict,
)
from orchestrator.attempts.history_follow import reported_loss_summary
from orchestrator.attempts.printed_metrics import printed_losses
from orchestrator.attempts.stdout_follow import printed_loss_summary


def test_a_learning_run_is_not_diverged() -> None:
    losses = [2.0 - 0.01 * i for i in range(100)]
    summary = summarise_losses(losses, final_steps=20)
    assert summary.initial == pytest.approx(sum(losses[:10]) / 10)
    assert summary.final == pytest.approx(sum(losses[-20:]) / 20)
    assert verdict(summary) is None


def test_a_run_of_one_epoch_is_judged_on_its_last_steps_not_its_whole_descent() -> None:
    """The LoRA worker's one-epoch runs on a toy task: the loss fell from about 5 to 5e-5; the
    epoch's mean (0.22 here) is above 3 × the minimum, the last steps' is not."""
    losses = [5.0 * 0.9**i for i in range(100)] + [5e-5] * 25
    assert verdict(summarise_losses(losses, final_steps=len(losses))) is None
    assert summarise_losses(losses, final_steps=len(losses)).final_steps == 10
    assert "3 × its minimum" in str(verdict(summarise_losses(losses, final_steps=len(losses) - 1)))
    again = [*losses, *([0.5] * 10)]  # the last steps above 3 × the minimum: flagged still
    assert "3 × its minimum" in str(verdict(summarise_losses(again, final_steps=len(again))))


def test_a_last_epoch_above_the_first_steps_diverged() -> None:
    losses = [0.7] * 30 + [2.3e8, 9.2e8] * 5  # the lr 200 runs' end
    reason = verdict(summarise_losses(losses, final_steps=10))
    assert reason is not None and "above the first steps'" in reason


def test_a_flat_run_a_little_above_its_start_is_not_diverged() -> None:
    """A rate too small to learn: the loss never moves, and its last epoch ends a hair above the
    first steps by noise (4.411 against 4.405, seen on the tiny Llama at lr 1e-5)."""
    flat = [4.405 + 0.02 * ((7 * i) % 5 - 2) / 2 for i in range(100)]
    flat[-10:] = [v + 0.006 for v in flat[-10:]]
    summary = summarise_losses(flat, final_steps=10)
    assert summary.final is not None and summary.initial is not None and summary.final > summary.initial
    assert verdict(summary) is None
    rising = [4.4] * 90 + [4.4 * 1.06] * 10  # 6 % above: beyond the margin
    assert "above the first steps'" in str(verdict(summarise_losses(rising, final_steps=10)))


def test_k_times_the_minimum_is_configurable() -> None:
    # down from 5 to 0.1 and back up to 0.5: below the start, 5 × the minimum
    losses = [5.0] * 10 + [0.1] * 40 + [0.5] * 50
    summary = summarise_losses(losses, final_steps=50)
    assert summary.minimum == pytest.approx(0.1)
    assert verdict(summary, 3.0) is not None and "3 × its minimum" in str(verdict(summary, 3.0))
    assert verdict(summary, 6.0) is None
    assert verdict(summary, None) is None  # the minimum rule off: only the first steps count


def test_one_lucky_batch_is_not_the_minimum() -> None:
    losses = [1.0] * 100
    losses[50] = 0.01  # a single near-zero batch: the window's mean stays near 0.9
    summary = summarise_losses(losses, final_steps=10)
    assert summary.minimum is not None and summary.minimum > 0.8
    assert verdict(summary) is None


def test_a_non_finite_end_diverged_and_nothing_known_is_no_verdict() -> None:
    summary = summarise_losses([1.0, 0.5, math.nan, math.inf], final_steps=2)
    assert summary.nonfinite and summary.final is None
    assert verdict(summary) == "loss not finite at the end of training"
    assert verdict(summarise_losses([])) is None


def test_a_stream_of_printed_losses_gives_the_same_verdicts() -> None:
    track = LossTrack()
    for i in range(200):
        track.add(2.0 - 0.005 * i)
    assert verdict(track.summary()) is None
    assert track.summary().steps == 200 and track.summary().final_steps == 10
    for _ in range(10):
        track.add(50.0)
    assert verdict(track.summary()) is not None
    few = LossTrack()
    few.add(1.0)
    few.add(math.nan)
    assert verdict(few.summary()) == "loss not finite at the end of training"


def test_a_record_from_result_json_is_validated() -> None:
    good = LossSummary(1.0, 0.5, 0.6, 10, 5).to_record()
    assert summary_from_record(good) == LossSummary(1.0, 0.5, 0.6, 10, 5)
    for bad in (None, [], {**good, "final": "0.6"}, {**good, "steps": True}, {**good, "steps": -1},
                {**good, "final_steps": 11}, {**good, "nonfinite": "no"}, {**good, "initial": math.inf}):
        assert summary_from_record(bad) is None, bad


def test_the_losses_a_script_printed_are_read_from_both_ends_of_its_log(tmp_path: Path) -> None:
    lines = [str({"loss": 2.0 - 0.001 * i, "epoch": i / 1000}) for i in range(1000)]
    (tmp_path / "stdout.log").write_text("\n".join(lines))  # the last line unterminated
    summary = printed_loss_summary(tmp_path, None)
    assert summary is not None and summary.steps == 1000
    assert summary.initial == pytest.approx(2.0 - 0.001 * 4.5) and summary.final == pytest.approx(2.0 - 0.001 * 994.5)
    assert verdict(summary) is None
    (tmp_path / "stdout.log").write_text("\n".join(lines[:20] + ["{'loss': nan, 'epoch': 0.02}"] * 3) + "\n")
    summary = printed_loss_summary(tmp_path, None)
    assert verdict(summary) == "loss not finite at the end of training"  # type: ignore[arg-type]
    (tmp_path / "stdout.log").write_text("loading\ndone, accuracy 0.8\n")
    assert printed_loss_summary(tmp_path, None) is None
    (tmp_path / "stdout.log").unlink()
    (tmp_path / "stdout.log").symlink_to(tmp_path / "elsewhere.log")
    (tmp_path / "elsewhere.log").write_text("\n".join(lines))
    assert printed_loss_summary(tmp_path, None) is None  # never read through a link


def test_a_nan_loss_written_to_progress_jsonl_is_the_rules_evidence(tmp_path: Path) -> None:
    """The stored history keeps finite values only: a run whose progress.jsonl losses turned NaN
    read as a learning one (the same losses printed were flagged)."""
    good = [f'{{"step": {i}, "loss": {2.0 - 0.01 * i}}}' for i in range(1, 15)]
    nans = [f'{{"step": {i}, "loss": NaN}}' for i in range(15, 21)]
    (tmp_path / "progress.jsonl").write_text("\n".join([*good, *nans]))
    summary = reported_loss_summary(tmp_path)
    assert summary is not None and summary.steps == 20 and summary.nonfinite
    assert verdict(summary) == "loss not finite at the end of training"
    (tmp_path / "progress.jsonl").write_text("\n".join([*good, '{"step": 15, "loss": Infinity, "val": {"a": 1}}', ""]))
    infinite = reported_loss_summary(tmp_path)
    assert infinite is not None and verdict(infinite) == "loss not finite at the end of training"
    (tmp_path / "progress.jsonl").write_text("\n".join([*good, '{"loss": NaN}', '{"step": 2e300, "loss": NaN}', ""]))
    no_step = reported_loss_summary(tmp_path)
    assert no_step is not None and verdict(no_step) is None  # no step: no record
    (tmp_path / "progress.jsonl").unlink()
    assert reported_loss_summary(tmp_path) is None


def test_a_huge_log_is_read_at_its_ends_only(tmp_path: Path) -> None:
    """16 MiB of output: the first steps come from its head, the end from its tail; the middle
    (which would say nothing more about the rule's three numbers here) is never read."""
    head = "".join(f"step {i}/100000 loss={5.0:.3f}\n" for i in range(1, 11))
    filler = ("x" * 1000 + "\n") * (16 * 1024)
    tail = "".join(f"step {i}/100000 loss={9.0:.3f}\n" for i in range(99990, 100001))
    (tmp_path / "stdout.log").write_text(head + filler + tail)
    summary = printed_loss_summary(tmp_path, None)
    assert summary is not None and summary.initial == 5.0 and summary.final == 9.0
    assert verdict(summary) is not None


def test_the_scan_takes_training_losses_only() -> None:
    text = "\n".join([
        "{'loss': 2.5, 'grad_norm': 1.1, 'learning_rate': 5e-05, 'epoch': 0.1}",
        "{'eval_loss': 9.9, 'eval_accuracy': 0.5, 'epoch': 0.1}",  # not a training loss
        " 45%|####5     | 45/100 [00:09<00:11, 4.9it/s, loss=0.41]\r 46%|####6     | 46/100 [00:09<00:11, loss=0.40]",
        "step 7/100 loss 0.39",
        '{"step": 8, "loss": NaN}',
        "{'train_runtime': 12.0, 'train_loss': 0.8, 'epoch': 1.0}",  # the run's average, not a step
        "it 9 of 100: L=0.35",
    ])
    losses = printed_losses(text)
    assert losses[:5] == [2.5, 0.41, 0.40, 0.39, pytest.approx(math.nan, nan_ok=True)]
    assert len(losses) == 5
    assert printed_losses(text, re.compile(r"it (?P<step>\d+) of \d+: L=(?P<loss>[0-9.]+)"))[-1] == 0.35
