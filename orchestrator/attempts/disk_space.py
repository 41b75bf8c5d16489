"""Free space where run dirs are written, and the signs of a full disk in what an attempt left.

A full disk (ENOSPC) or an exhausted quota (EDQUOT) says nothing about a job: its attempt is
requeued without counting against its attempts, queued jobs wait while the runs dir's
filesystem is below `min_free_mib`, and the daemon warns below `warn_free_mib`.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import is_orch_shortage

DEFAULT_MIN_FREE_MIB = 256
DEFAULT_WARN_FREE_MIB = 5 * 1024
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# How Python, C libraries and shells print the two errors.
_EVIDENCE = re.compile(
    r"\[Errno (?:28|122)\]|No space left on device|Disk quota exceeded|\bENOSPC\b|\bEDQUOT\b"
)


@dataclass(frozen=True)
class DiskState:
    path: str
    free_mib: int | None  # None: the filesystem could not be read
    min_free_mib: int
    warn_free_mib: int

    @property
    def full(self) -> bool:
        return self.free_mib is not None and self.free_mib < self.min_free_mib

    @property
    def low(self) -> bool:
        return self.free_mib is not None and self.free_mib < self.warn_free_mib

    @property
    def level(self) -> str:
        return "full" if self.full else "low" if self.low else "ok"

    def wait_reason(self) -> str:
        return (
            f"disk full: {self.path} has {self.free_mib} MiB free; jobs wait until "
            f"{self.min_free_mib} MiB are free"
        )

    def warning(self) -> str:
        return f"disk space low: {self.path} has {self.free_mib} MiB free (warning below {self.warn_free_mib} MiB)"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "level": self.level}


def free_mib(path: Path) -> int | None:
    """MiB an unprivileged writer may still use on the filesystem of `path` (its nearest
    existing ancestor); None when it cannot be read."""
    current = Path(path)
    while not current.exists() and current.parent != current:
        current = current.parent
    try:
        info = os.statvfs(current)
    except OSError:
        return None
    return int(info.f_bavail * info.f_frsize // (1024 * 1024))


def disk_state(path: Path, min_free_mib: int, warn_free_mib: int) -> DiskState:
    return DiskState(str(path), free_mib(path), min_free_mib, warn_free_mib)


def is_disk_full_error(exc: BaseException) -> bool:
    """ENOSPC/EDQUOT from the OS, or SQLite's full database (errors.DatabaseDiskFull)."""
    from orchestrator.errors import DatabaseDiskFull

    return isinstance(exc, DatabaseDiskFull) or (isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS)


def disk_full_evidence(*texts: str | None) -> str | None:
    """The first line naming ENOSPC/EDQUOT in the given texts (log tail, result error)."""
    for text in texts:
        if not text:
            continue
        for line in reversed(text.splitlines()):
            if _EVIDENCE.search(line):
                return line.strip()[:200]
    return None


def orchs_own_error(exc: BaseException) -> bool:
    """A full disk or orch's own shortage (descriptors, processes, memory): never an attempt's."""
    return is_disk_full_error(exc) or is_orch_shortage(exc)
