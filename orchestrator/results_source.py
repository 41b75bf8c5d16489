"""Reads the succeeded jobs' result.json files into ResultRows, each traced to its attempt.

result.json is written by user code: anything but a mapping of numbers under metrics.test is
counted as missing, never trusted."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from orchestrator.reconcile import read_result
from orchestrator.results import ResultRow
from orchestrator.stdout_parse import number
from orchestrator.store.db import Store
from orchestrator.store.queue import succeeded_jobs_with_attempts


def collect_rows(store: Store, suite: str | None = None) -> tuple[list[ResultRow], int]:
    """(rows, how many succeeded jobs had no usable test metrics)."""
    rows: list[ResultRow] = []
    missing = 0
    for job, attempt in succeeded_jobs_with_attempts(store, suite):
        test = job_metrics(read_result(Path(attempt.run_dir)), attempt.output_metrics or None)
        if test is None:
            missing += 1
            continue
        numeric = finite_metrics(test)
        rows.append(ResultRow(
            job.suite, job.config_name, job.data, job.seed, numeric,
            job=job.id, attempt=attempt.n, level=attempt.level, step=attempt.level_step,
            changes=dict(attempt.overrides), run_alone=attempt.run_alone,
        ))  # fmt: skip
    return rows, missing


def job_metrics(result: dict[str, Any] | None, printed_json: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """A job's metrics: result.json's `metrics.test` (or a flat `metrics` of numbers), else what
    its script printed (parsed when the attempt ended); `eval_X` and `test_X` also count as X."""
    metrics: Any = None
    if isinstance(result, dict) and isinstance(result.get("metrics"), dict):
        reported = result["metrics"]
        metrics = reported.get("test") if isinstance(reported.get("test"), dict) else reported
    if not metrics and isinstance(printed_json, dict):
        metrics = printed_json  # parsed already (a typed Attempt's output_metrics)
    elif not metrics and isinstance(printed_json, str) and printed_json:
        with contextlib.suppress(ValueError):
            metrics = json.loads(printed_json)
    if not isinstance(metrics, dict) or not metrics:
        return None
    named = dict(metrics)
    for key, value in metrics.items():
        for prefix in ("test_", "eval_"):
            if isinstance(key, str) and key.startswith(prefix):
                named.setdefault(key[len(prefix):], value)
    return named


def finite_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers among a job's metrics (written by user code: NaN, infinities, ints
    too large for a float and non-numbers are left out, never shown or averaged)."""
    kept: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)):
            finite = number(value)
            if finite is not None:
                kept[str(key)] = finite
    return kept
