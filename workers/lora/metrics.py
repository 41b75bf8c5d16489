"""GLUE metrics in pure Python: accuracy, binary F1 and Matthews correlation.

Each task has one primary metric (the GLUE convention) used to pick the best checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# GLUE convention: F1 for the paraphrase tasks, Matthews correlation for CoLA, else accuracy.
PRIMARY_METRIC: dict[str, str] = {
    "cola": "mcc",
    "sst2": "accuracy",
    "mrpc": "f1",
    "qqp": "f1",
    "mnli": "accuracy",
    "qnli": "accuracy",
    "rte": "accuracy",
    "wnli": "accuracy",
}


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Share of predictions equal to the label; 0.0 for no examples."""
    _check_lengths(predictions, labels)
    if not labels:
        return 0.0
    return sum(int(p == y) for p, y in zip(predictions, labels, strict=True)) / len(labels)


def f1_binary(predictions: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
    """F1 of the positive class; 0.0 when there are no true positives."""
    _check_lengths(predictions, labels)
    pairs = list(zip(predictions, labels, strict=True))
    true_pos = sum(1 for p, y in pairs if p == positive and y == positive)
    false_pos = sum(1 for p, y in pairs if p == positive and y != positive)
    false_neg = sum(1 for p, y in pairs if p != positive and y == positive)
    if true_pos == 0:
        return 0.0
    return 2 * true_pos / (2 * true_pos + false_pos + false_neg)


def matthews_corrcoef(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Matthews correlation of binary predictions; 0.0 when undefined (a constant column)."""
    _check_lengths(predictions, labels)
    pairs = list(zip(predictions, labels, strict=True))
    tp = sum(1 for p, y in pairs if p == 1 and y == 1)
    tn = sum(1 for p, y in pairs if p != 1 and y != 1)
    fp = sum(1 for p, y in pairs if p == 1 and y != 1)
    fn = sum(1 for p, y in pairs if p != 1 and y == 1)
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    if denominator == 0:
        return 0.0
    return (tp * tn - fp * fn) / denominator


def task_metrics(task: str, predictions: Sequence[int], labels: Sequence[int]) -> dict[str, float]:
    """Every metric GLUE reports for `task` (accuracy always included)."""
    scores = {"accuracy": accuracy(predictions, labels)}
    if task in ("mrpc", "qqp"):
        scores["f1"] = f1_binary(predictions, labels)
    if task == "cola":
        scores["mcc"] = matthews_corrcoef(predictions, labels)
    return scores


def _check_lengths(predictions: Sequence[int], labels: Sequence[int]) -> None:
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
