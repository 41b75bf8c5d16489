"""The worker side of orch's file protocol, shared by every worker we ship.

A run dir holds `config.yaml` (written by orch), `progress.jsonl` (one heartbeat per line) and
`result.json` (written once, at the end). Writes are atomic (temp file + rename) so a reader
never sees half a file. The file names and the writer come from `orchestrator.rundir_files`,
the one module of orchestrator a worker imports (it needs nothing outside the standard
library); nothing else of orchestrator is imported here, so a worker starts fast.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.rundir_files import TOKEN_VAR, RunDir, write_json

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
DISK_RETRY_S = 1.0

# Exit codes orch recognises without reading the log.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_OOM = 3  # CUDA out of memory, caught and reported in result.json
EXIT_CONFIG_ERROR = 4  # invalid configuration: never retried

# result.json "status" values
STATUS_SUCCEEDED = "succeeded"
STATUS_OOM = "oom"
STATUS_FAILED = "failed"
STATUS_CONFIG_ERROR = "config_error"


def finite_json(value: Any) -> Any:
    """`value` with every NaN or infinite float replaced by None: JSON has no such numbers, and
    Python's bare `NaN` would make the whole record unreadable to a strict reader."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(item) for item in value]
    return value


class Heartbeat:
    """Appends progress lines to `progress.jsonl`; each line is flushed so orch sees it at once."""

    def __init__(self, run_dir: Path) -> None:
        self.path = RunDir(run_dir).progress

    def check_stopped(self) -> None:
        """Raise where orch has stopped the job: a warm process's job stops before it writes
        into a run dir whose attempt has ended. A process of its own is stopped by signal."""

    def beat(
        self,
        step: int,
        total: int,
        loss: float | None = None,
        samples_per_s: float | None = None,
        peak_mem_mib: int | None = None,
        **extra: Any,
    ) -> None:
        record: dict[str, Any] = {
            "t": time.time(),
            "step": step,
            "total": total,
            "loss": loss,
            "samples_per_s": samples_per_s,
            "peak_mem_mib": peak_mem_mib,
        }
        record.update(extra)
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(finite_json(record), default=str, allow_nan=False) + "\n")
                handle.flush()
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                raise
            # A full disk loses this heartbeat, not the run: orch holds its judgement meanwhile.


def write_result(
    run_dir: Path,
    status: str,
    *,
    error: str | None = None,
    metrics: dict[str, Any] | None = None,
    peak_mem_mib: int | None = None,
    samples_per_s: float | None = None,
    steps: int | None = None,
    seconds: float | None = None,
    **extra: Any,
) -> None:
    """Write `result.json`. `status` is one of the STATUS_* values."""
    payload: dict[str, Any] = {
        "status": status,
        "error": error,
        "metrics": metrics or {},
        "peak_mem_mib": peak_mem_mib,
        "samples_per_s": samples_per_s,
        "steps": steps,
        "seconds": seconds,
    }
    payload.update(extra)
    if os.environ.get(TOKEN_VAR):
        payload["token"] = os.environ[TOKEN_VAR]  # orch ignores a result.json of ours without it
    said = False
    while True:
        try:
            write_json(RunDir(run_dir).result, finite_json(payload), parents=True)
            return
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                raise
            if not said:  # the result is the run's point: wait for room rather than lose it
                print("worker: disk full, waiting for room to write result.json", file=sys.stderr, flush=True)
                said = True
            time.sleep(DISK_RETRY_S)


def read_last_progress(run_dir: Path) -> dict[str, Any] | None:
    """The last complete heartbeat line, or None."""
    path = RunDir(run_dir).progress
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 8192))
            lines = handle.read().decode("utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if isinstance(record, dict):
            return record
    return None
