"""Reads the succeeded jobs' result.json files into ResultRows, each traced to its attempt.

result.json is written by user code: anything but a mapping of numbers under metrics.test is
counted as missing, never trusted."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.reconcile import read_result
from orchestrator.results import ResultRow
from orchestrator.store.db import Store
from orchestrator.store.queries import succeeded_attempts


def collect_rows(store: Store, suite: str | None = None) -> tuple[list[ResultRow], int]:
    """(rows, how many succeeded jobs had no usable test metrics)."""
    rows: list[ResultRow] = []
    missing = 0
    for job in succeeded_attempts(store, suite):
        result = read_result(Path(job["run_dir"]))
        metrics = result.get("metrics", {}) if isinstance(result, dict) else None
        test = metrics.get("test") if isinstance(metrics, dict) else None
        if not isinstance(test, dict):
            missing += 1
            continue
        numeric = {k: float(v) for k, v in test.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        try:
            changes = json.loads(job["overrides_json"] or "{}")
        except ValueError:
            changes = {}
        rows.append(ResultRow(
            job["suite"], job["config_name"], job["data"], job["seed"], numeric,
            job=job["job_id"], attempt=job["n"], level=job["level"], step=job["level_step"],
            changes=changes if isinstance(changes, dict) else {}, run_alone=bool(job["run_alone"]),
        ))  # fmt: skip
    return rows, missing
