"""Bounded reads of the files a worker writes in its run dir (untrusted: any size, any bytes,
maybe a symlink). Only the tail is read, symlinks are not followed, non-files are ignored."""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

LOG_TAIL_BYTES = 32 * 1024
RESULT_MAX_BYTES = 1024 * 1024
PROGRESS_TAIL_BYTES = 1024 * 1024
MAX_CURVE_POINTS = 400


def read_tail(path: Path, max_bytes: int) -> bytes:
    """The last `max_bytes` of a regular file; b"" when missing, a symlink or not a file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return b""
        os.lseek(fd, max(0, info.st_size - max_bytes), os.SEEK_SET)
        chunks, left = [], max_bytes
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return b""
    finally:
        os.close(fd)


def read_result_json(run_dir: str, max_bytes: int = RESULT_MAX_BYTES) -> dict[str, object] | None:
    """result.json as a dict; None when missing, a symlink, larger than `max_bytes` or not a
    JSON object."""
    data = read_tail(Path(run_dir) / "result.json", max_bytes + 1)
    if not data or len(data) > max_bytes:
        return None
    try:
        value = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def log_tail(run_dir: str, max_bytes: int = LOG_TAIL_BYTES) -> str:
    return read_tail(Path(run_dir) / "stdout.log", max_bytes).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class LossPoint:
    step: float
    loss: float


def loss_curve(run_dir: str, max_points: int = MAX_CURVE_POINTS) -> list[LossPoint]:
    """(step, loss) from the tail of progress.jsonl, thinned to at most `max_points`."""
    data = read_tail(Path(run_dir) / "progress.jsonl", PROGRESS_TAIL_BYTES)
    points: list[LossPoint] = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue  # a partial first line, or a line being written
        if not isinstance(record, dict):
            continue
        step, loss = record.get("step"), record.get("loss")
        if isinstance(step, (int, float)) and isinstance(loss, (int, float)) and _finite(step) and _finite(loss):
            points.append(LossPoint(float(step), float(loss)))
    if len(points) > max_points:
        stride = math.ceil(len(points) / max_points)
        points = points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])
    return points


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
