"""The worker side of orch's file protocol, shared by every worker we ship.

A run dir holds `config.yaml` (written by orch), `progress.jsonl` (one heartbeat per line) and
`result.json` (written once, at the end). Writes are atomic (temp file + rename) so a reader
never sees half a file. Workers must not import orchestrator: this module is the whole contract.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

PROGRESS_FILE = "progress.jsonl"
RESULT_FILE = "result.json"

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


def atomic_write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON to `path` through a temp file in the same directory and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2, sort_keys=True, default=str)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


class Heartbeat:
    """Appends progress lines to `progress.jsonl`; each line is flushed so orch sees it at once."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / PROGRESS_FILE

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
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
            handle.flush()


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
    atomic_write_json(Path(run_dir) / RESULT_FILE, payload)


def read_last_progress(run_dir: Path) -> dict[str, Any] | None:
    """The last complete heartbeat line, or None."""
    path = Path(run_dir) / PROGRESS_FILE
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
