"""A Hugging Face Trainer script that only prints dicts gets its results table: what
`print(trainer.evaluate())` and `print(trainer.predict(test).metrics)` print (Python dicts, read
with ast.literal_eval of a bounded line) are its validation (`eval_*`) and test (`test_*`)
metrics, each once, and the results header says how they were read."""

from __future__ import annotations

import shlex
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.attempts.printed_results import parse_result
from orchestrator.results.collect import PRINTED_SPLITS_NOTE, job_metrics, val_metrics
from tests.e2e_helpers import Orch, orch_env, requires_tmux
from tests.script_suites import write_script_suite

PY = shlex.quote(sys.executable)
# What a Trainer script prints: log dicts while training, its summary, then the two calls.
TRAINER_OUTPUT = textwrap.dedent(
    """\
    {'loss': 0.69, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 1.0}
    {'eval_loss': 0.52, 'eval_accuracy': 0.84, 'eval_runtime': 0.4, 'eval_samples_per_second': 80.0, 'epoch': 1.0}
    {'train_runtime': 3.1, 'train_samples_per_second': 30.9, 'train_loss': 0.6, 'epoch': 3.0}
    {'eval_loss': 0.41, 'eval_accuracy': 0.91, 'eval_runtime': 0.4, 'epoch': 3.0}
    {'test_loss': 0.45, 'test_accuracy': 0.88, 'test_runtime': 0.5, 'test_samples_per_second': 64.0}
    """
)


def test_printed_trainer_dicts_are_val_and_test_metrics() -> None:
    printed = parse_result(TRAINER_OUTPUT)
    assert printed == {
        "eval_loss": 0.41,
        "eval_accuracy": 0.91,
        "test_loss": 0.45,
        "test_accuracy": 0.88,
    }
    assert job_metrics(None, printed) == {"loss": 0.45, "accuracy": 0.88}  # each once, on its split
    assert val_metrics(None, printed) == {"loss": 0.41, "accuracy": 0.91}
    only_eval = parse_result(TRAINER_OUTPUT.rsplit("{'test_loss'", 1)[0])
    assert only_eval == {"eval_loss": 0.41, "eval_accuracy": 0.91}
    assert job_metrics(None, only_eval) is None  # no test split printed: no test metrics, val kept
    assert parse_result("{'loss': 0.69, 'epoch': 1.0}\n{'train_loss': 0.6, 'epoch': 3.0}\n") is None
    mixed = parse_result(
        '{"eval_loss": 0.3}\n{"accuracy": 0.8, "eval_accuracy": 0.7, "epoch": 2}\n'
    )
    assert mixed == {"accuracy": 0.8, "eval_accuracy": 0.7}  # the last line's own keys are kept
    # bounded and never evaluated: a call or a name is not a literal
    assert parse_result("{'eval_accuracy': __import__('os').getpid()}\n") is None
    assert parse_result("{'eval_accuracy': 0.5, 'x': '" + "y" * 5000 + "'}\n") is None


def test_a_printed_nan_or_infinity_is_named_by_results_not_lost_with_the_runs_other_metrics() -> None:
    """A run that diverged prints `{"accuracy": NaN, ...}` (json.dumps) or `{'test_loss': nan}`
    (print of a dict): its metric is named as a result.json's would be, its finite val counts."""
    from orchestrator.attempts.reported import reading_of

    for printed_line, nonfinite in (('{"accuracy": NaN, "eval_accuracy": 0.75}', {"accuracy": "nan"}),
                                    ('{"accuracy": -Infinity, "eval_accuracy": 0.75}', {"accuracy": "-inf"}),
                                    ("{'test_accuracy': nan, 'eval_accuracy': 0.75}", {"accuracy": "nan"}),
                                    ("{'test_accuracy': -inf , 'eval_accuracy': 0.75}", {"accuracy": "-inf"})):
        printed = parse_result("step 1/4 loss 0.5\n" + printed_line + "\n")
        assert printed is not None, printed_line
        reading = reading_of(None, printed)
        assert (reading.metrics, reading.val_metrics) == ({}, {"accuracy": 0.75}), printed_line
        assert reading.nonfinite_test == nonfinite, printed_line
    # a quoted 'nan' is text, a key named nan is a key: neither is read as a number
    assert parse_result("{'test_note': 'nan', 'test_accuracy': 0.5}\n") == {"test_accuracy": 0.5}
    assert parse_result("{'test_accuracy': 0.5, 'nan': inf}\n") == {"test_accuracy": 0.5, "nan": float("inf")}
    # the names are read as floats in the tree, never by rewriting text: a string saying nan stays text
    assert parse_result("{'test_accuracy': 0.5, 'test_note': 'x: nan, y', 'test_f1': -inf}\n") == {
        "test_accuracy": 0.5, "test_f1": float("-inf")}
    assert parse_result("{'test_accuracy': 0.5, 'test_x': '__orch_nonfinite__:nan'}\n") == {"test_accuracy": 0.5}
    assert parse_result("{'test_accuracy': nan, 'test_x': os.sep}\n") is None  # any other name: no literal


SCRIPT = textwrap.dedent(
    """\
    import sys

    seed = int(sys.argv[1])
    for step in range(1, 4):
        print({"loss": round(1.0 / step, 3), "learning_rate": 5e-05, "epoch": float(step)}, flush=True)
    print({"eval_loss": 0.41, "eval_accuracy": 0.9 + seed / 100, "eval_runtime": 0.4, "epoch": 3.0})
    print({"test_loss": 0.45, "test_accuracy": 0.8 + seed / 100, "test_runtime": 0.5})
    """
)


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path) as env:
        yield env


@requires_tmux
def test_a_trainer_script_that_only_prints_dicts_gets_its_results_row(orch: Orch) -> None:
    (orch.root / "train.py").write_text(SCRIPT)
    write_script_suite(orch, "hf", f"{PY} train.py {{seed}}", {"base": {"lr": 5e-05}})
    orch.submit("hf", "1:toy,2:toy")
    orch.start_daemon()
    assert orch.wait_all_done(90) == {1: "succeeded", 2: "succeeded"}
    (row,) = orch.json("results")  # one row: accuracy, never eval_accuracy beside it
    assert (row["metric"], row["n_seeds"]) == ("accuracy", 2)
    assert row["mean"] == pytest.approx(0.815) and row["val_mean"] == pytest.approx(0.915)
    assert [run["val"] for run in row["runs"]] == [pytest.approx(0.91), pytest.approx(0.92)]
    table = orch.run("results").stdout
    assert PRINTED_SPLITS_NOTE in table and "no test metrics" not in table
