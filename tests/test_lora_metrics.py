from __future__ import annotations

import math

import pytest

from workers.lora.metrics import accuracy, f1_binary, matthews_corrcoef, task_metrics

PREDICTIONS = [1, 1, 0, 0, 1, 0, 1, 1]
LABELS = [1, 0, 0, 1, 1, 0, 0, 1]
# By hand: tp=3 (idx 0,4,7), fp=2 (1,6), tn=2 (2,5), fn=1 (3).


def test_accuracy() -> None:
    assert accuracy(PREDICTIONS, LABELS) == pytest.approx(5 / 8)
    assert accuracy([], []) == 0.0


def test_f1_by_hand() -> None:
    # precision 3/5, recall 3/4 -> F1 = 2pr/(p+r) = 2/3
    assert f1_binary(PREDICTIONS, LABELS) == pytest.approx(2 / 3)
    assert f1_binary([0, 0], [1, 0]) == 0.0


def test_mcc_by_hand() -> None:
    expected = (3 * 2 - 2 * 1) / math.sqrt(5 * 4 * 3 * 4)  # (tp tn - fp fn) / sqrt(...)
    assert matthews_corrcoef(PREDICTIONS, LABELS) == pytest.approx(expected)
    assert matthews_corrcoef([1, 0, 1], [1, 0, 1]) == pytest.approx(1.0)
    assert matthews_corrcoef([0, 1], [1, 0]) == pytest.approx(-1.0)
    assert matthews_corrcoef([1, 1, 1], [1, 0, 1]) == 0.0  # constant prediction: undefined -> 0


def test_task_metrics_per_glue_convention() -> None:
    assert set(task_metrics("rte", PREDICTIONS, LABELS)) == {"accuracy"}
    assert set(task_metrics("mrpc", PREDICTIONS, LABELS)) == {"accuracy", "f1"}
    assert set(task_metrics("cola", PREDICTIONS, LABELS)) == {"accuracy", "mcc"}
    assert task_metrics("mnli", [0, 1, 2], [0, 2, 2])["accuracy"] == pytest.approx(2 / 3)


def test_length_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError):
        accuracy([1], [1, 0])
