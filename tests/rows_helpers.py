"""Typed rows for tests of the pure parts: an Attempt or a Job from a few columns, the rest
filled with what a fresh row holds."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.store.rows import Attempt, Job

ATTEMPT_DEFAULTS: dict[str, Any] = {
    "id": 1, "job_id": 1, "n": 1, "gpu_index": 0, "gpu_uuid": "GPU-0", "level": 0, "run_dir": "run",
    "predicted_peak_mib": 0, "prediction_source": "declared", "reserved_mib": 0, "held_mib": 0, "peak_mib": 0,
    "reached_peak": 0, "started_at": 0.0, "run_alone": 0, "predicted_host_mib": 0, "host_held_mib": 0,
    "host_peak_mib": 0,
}

JOB_DEFAULTS: dict[str, Any] = {
    "id": 1, "identity": "x", "suite": "s", "config_name": "c", "config_path": "c.yaml", "config_json": "{}",
    "seed": 1, "data": "task", "worker": "sim", "declared_mib": 1024, "priority": 0, "state": "queued", "level": 0,
    "attempt_count": 0, "max_attempts": 8, "one_token": 0, "hang_timeout_s": 1800.0, "queued_at": 0.0,
    "created_at": 0.0, "updated_at": 0.0, "crash_loop_failures": 3, "crash_loop_within_s": 30.0,
    "crash_loop_window_s": 300.0, "gpus": 1,
}


def attempt_of(**columns: Any) -> Attempt:
    """An Attempt from column values (`*_json` columns may be given as values: they are dumped)."""
    return Attempt.from_row({**ATTEMPT_DEFAULTS, **_dumped(columns)})


def job_of(**columns: Any) -> Job:
    return Job.from_row({**JOB_DEFAULTS, **_dumped(columns)})


def _dumped(columns: dict[str, Any]) -> dict[str, Any]:
    return {k: json.dumps(v) if k.endswith("_json") and not isinstance(v, str) and v is not None else v
            for k, v in columns.items()}
