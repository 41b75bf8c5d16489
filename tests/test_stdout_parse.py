"""Progress and results parsed from what scripts print (pure; no tmux, no daemon)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from tqdm import tqdm

from orchestrator.attempts.printed_metrics import StdoutProgress, parse_dict
from orchestrator.attempts.printed_results import parse_result


def feed_all(text: str, chunk: int = 7, regex: str | None = None) -> StdoutProgress:
    """Feed `text` in small chunks, as the daemon reads a growing log."""
    parser = StdoutProgress.with_regex(regex)
    for start in range(0, len(text), chunk):
        parser.feed(text[start : start + chunk])
    return parser


def real_tqdm_output(total: int, upto: int, postfix: dict[str, float] | None = None) -> str:
    """What tqdm really writes to a file: every redraw starts with a carriage return, no newline."""
    out = io.StringIO()
    bar = tqdm(total=total, file=out, mininterval=0, miniters=1, ascii=True)
    for _ in range(upto):
        if postfix:
            bar.set_postfix(postfix, refresh=False)
        bar.update(1)
    return out.getvalue()  # not closed: the bar is still being redrawn


def test_tqdm_bar_redrawn_with_carriage_returns_and_no_newline() -> None:
    text = real_tqdm_output(100, 12)
    assert "\n" not in text and text.count("\r") >= 12
    snapshot = feed_all(text).snapshot()
    assert snapshot is not None
    assert (snapshot["step"], snapshot["total"]) == (12, 100)


def test_tqdm_postfix_loss() -> None:
    snapshot = feed_all(real_tqdm_output(40, 5, {"loss": 0.4125})).snapshot()
    assert snapshot is not None
    # tqdm prints 3 digits
    assert (snapshot["step"], snapshot["total"], snapshot["loss"]) == (5, 40, pytest.approx(0.412))


@pytest.mark.parametrize(
    "line",
    [
        "{'loss': 0.41, 'grad_norm': 1.5, 'learning_rate': 5e-05, 'epoch': 0.5}",
        "{'loss': '0.41', 'grad_norm': '1.5', 'learning_rate': '5e-05', 'epoch': '0.5'}",  # recent transformers
        '{"loss": 0.41, "learning_rate": 5e-05, "epoch": 0.5}',
        "[rank0]: {'loss': 0.41, 'learning_rate': 5e-05, 'epoch': 0.5}",
    ],
)
def test_trainer_log_dicts_plain_and_quoted(line: str) -> None:
    snapshot = feed_all(line + "\n").snapshot()
    assert snapshot is not None
    assert snapshot["loss"] == pytest.approx(0.41)
    assert snapshot["epoch"] == pytest.approx(0.5)
    assert snapshot["learning_rate"] == pytest.approx(5e-5)


def test_trainer_dict_lines_between_tqdm_redraws_and_eval_metrics() -> None:
    text = (
        real_tqdm_output(200, 20)
        + "\r{'loss': '6.077', 'grad_norm': '3.2', 'learning_rate': '4.9e-05', 'epoch': '0.04'}\n"
        + real_tqdm_output(200, 30)
        + "\n{'eval_loss': 0.9, 'eval_accuracy': 0.61, 'epoch': 0.1}\n"
        + real_tqdm_output(25, 7)  # an evaluation bar: smaller total, not the training progress
    )
    snapshot = feed_all(text, chunk=13).snapshot()
    assert snapshot is not None
    assert (snapshot["step"], snapshot["total"]) == (30, 200)
    assert snapshot["loss"] == pytest.approx(6.077)
    assert snapshot["eval_accuracy"] == pytest.approx(0.61)
    assert snapshot["epoch"] == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("line", "step", "total"),
    [("step 15/40 loss 0.52", 15, 40), ("Step 7 of 9, loss=1.25", 7, 9), ("[train] step: 3 / 10", 3, 10)],
)
def test_step_n_of_m_lines(line: str, step: int, total: int) -> None:
    snapshot = feed_all(line + "\n").snapshot()
    assert snapshot is not None
    assert (snapshot["step"], snapshot["total"]) == (step, total)


def test_step_line_loss() -> None:
    snapshot = feed_all("step 15/40 loss 0.52\n").snapshot()
    assert snapshot is not None and snapshot["loss"] == pytest.approx(0.52)


def test_interleaved_ranks_do_not_move_the_step_back() -> None:
    lines = ["rank0 step 11/40", "rank1 step 10/40", "rank0 step 12/40", "rank1 step 11/40"]
    snapshot = feed_all("\n".join(lines) + "\n").snapshot()
    assert snapshot is not None and snapshot["step"] == 12


def test_interleaved_half_lines_of_two_ranks() -> None:
    # Two processes writing to one pipe: each write is whole, lines interleave.
    text = "step 5/40\nstep 4/40\n{'loss': 0.8}\nstep 6/40\nstep 5/40\n"
    snapshot = feed_all(text, chunk=3).snapshot()
    assert snapshot is not None
    assert (snapshot["step"], snapshot["loss"]) == (6, pytest.approx(0.8))


def test_a_new_epoch_bar_starts_again() -> None:
    text = real_tqdm_output(50, 50) + "\n" + real_tqdm_output(50, 3)
    snapshot = feed_all(text).snapshot()
    assert snapshot is not None and snapshot["step"] == 3


def test_suite_progress_regex_wins() -> None:
    regex = r"it=(?P<step>\d+)\|(?P<total>\d+) l=(?P<loss>[0-9.]+)"
    text = "it=3|50 l=0.9\nsome 99/100 [ noise\nit=4|50 l=0.8\n"
    snapshot = feed_all(text, regex=regex).snapshot()
    assert snapshot is not None
    assert (snapshot["step"], snapshot["total"], snapshot["loss"]) == (4, 50, pytest.approx(0.8))


def test_partial_numbers_are_not_taken() -> None:
    parser = StdoutProgress()
    parser.feed("step 1")  # "step 15/40" cut in the middle
    assert parser.snapshot() is None
    parser.feed("5/40\n")
    snapshot = parser.snapshot()
    assert snapshot is not None and snapshot["step"] == 15


def test_resync_skips_the_partial_first_line() -> None:
    parser = StdoutProgress()
    parser.resync(mid_line=True)
    parser.feed("0/40 garbage\nstep 21/40\n")  # a read that started inside "step 20/40"
    snapshot = parser.snapshot()
    assert snapshot is not None and snapshot["step"] == 21


def test_nothing_understood_is_none_and_junk_does_not_raise() -> None:
    parser = StdoutProgress()
    parser.feed("loading model...\n" + "{" * 5000 + "\n\x00\xff binary \n{'a': [1, 2}\n" + "x" * 100_000)
    assert parser.snapshot() is None


def test_parse_dict_rejects_non_numbers_and_huge_values() -> None:
    assert parse_dict("{'loss': 'abc', 'acc': 0.5, 'x': [1]}") == {"acc": 0.5}
    assert parse_dict("{'loss': 1e999}") is None
    assert parse_dict("{'loss': True}") is None


def test_result_last_json_line() -> None:
    tail = (
        "{'loss': 0.3, 'epoch': 1.0}\n"  # a Trainer log line (a Python dict) is not a result
        '{"eval_accuracy": 0.75}\n'
        'done\n{"eval_accuracy": 0.81, "eval_loss": 0.4}\n'
        "saving...\n"
    )
    assert parse_result(tail) == {"eval_accuracy": 0.81, "eval_loss": 0.4}


def test_result_regex_last_match() -> None:
    tail = "test acc 0.70 f1 0.6\n...\ntest acc 0.80 f1 0.7\n{\"other\": 1}\n"
    regex = r"test acc (?P<accuracy>[0-9.]+) f1 (?P<f1>[0-9.]+)"
    assert parse_result(tail, regex) == {"accuracy": 0.8, "f1": 0.7}


def test_no_result() -> None:
    assert parse_result("{'loss': 0.3}\nbye\n") is None
    assert parse_result("") is None


def test_real_trainer_log() -> None:
    """stdout+stderr of transformers' Trainer (tqdm bars, quoted-number log dicts, an evaluation
    bar, then the script's own `print(json.dumps(trainer.evaluate()))`), as captured on CPU."""
    text = (Path(__file__).parent / "data" / "stdout" / "hf_trainer_cpu.log").read_text(encoding="utf-8")
    snapshot = feed_all(text, chunk=64).snapshot()
    assert snapshot is not None
    assert (snapshot["step"], snapshot["total"]) == (6, 6)  # the training bar, not the 4-step eval bar
    assert snapshot["loss"] == pytest.approx(4.076)
    assert snapshot["epoch"] == pytest.approx(1.5)
    result = parse_result(text)
    assert result is not None and result["eval_loss"] == pytest.approx(4.071030616760254)


def test_json_log_lines_with_a_step() -> None:
    snapshot = feed_all('{"step": 10, "max_steps": 100, "loss": 0.3}\n{"step": 11, "loss": "0.29"}\n').snapshot()
    assert snapshot is not None
    assert (snapshot["step"], snapshot["total"], snapshot["loss"]) == (11, 100, pytest.approx(0.29))


def described_tqdm_output(desc: str, total: int, upto: int) -> str:
    out = io.StringIO()
    bar = tqdm(total=total, file=out, mininterval=0, miniters=1, desc=desc)
    for _ in range(upto):
        bar.update(1)
    bar.close()
    return out.getvalue()


def test_loading_and_data_bars_are_not_training_steps() -> None:
    # What transformers and datasets print before the first optimizer step: taken as steps,
    # a model load read as step 219 and its memory then as the shape's peak.
    text = (
        described_tqdm_output("Loading weights", 219, 219)
        + described_tqdm_output("Map", 3200, 3200)
        + described_tqdm_output("Tokenizing train", 50, 50)
    )
    assert feed_all(text).snapshot() is None
    text += real_tqdm_output(1200, 12)
    snapshot = feed_all(text).snapshot()
    assert snapshot is not None
    assert (snapshot["step"], snapshot["total"]) == (12, 1200)
    # an undescribed or plainly named training bar still counts
    named = feed_all(described_tqdm_output("Epoch 1", 100, 30)).snapshot()
    assert named is not None and named["step"] == 30


def test_trl_dataset_bars_are_not_training_steps() -> None:
    # TRL's `trl sft` prepares its data with bars whose names say nothing of loading: taken as
    # steps, step K came from tokenising, at a fraction of the training peak
    data = [
        "Generating train split: 6000 examples [00:00, 129683.31 examples/s]\n",
        "Adding EOS to train dataset:  56%|#####6    | 3362/6000 [00:00<00:00, 33080.95 examples/s]\r",
        "Adding EOS to train dataset: 100%|##########| 6000/6000 [00:00<00:00, 33382.71 examples/s]\n",
        "Truncating train dataset: 100%|##########| 6000/6000 [00:00<00:00, 9000.00 examples/s]\n",
        "Some custom pass: 100%|##########| 6000/6000 [00:00<00:00, 512.00 ba/s]\n",
    ]
    assert feed_all("".join(data)).snapshot() is None
    snapshot = feed_all("".join(data) + "  6%|6         | 1/16 [00:02<00:43,  2.91s/it]\n").snapshot()
    assert snapshot is not None and (snapshot["step"], snapshot["total"]) == (1, 16)
