"""An attempt's share.json: which warm LoRA worker process trains its job (`share_base`).

The LoRA worker's client writes it once a warm process took the job: `{"mode": "sequential" |
"fused", "process": "<key16>-<slot>", "pid": int, "base_mem_mib": int | null}`. It is written by
user code like everything in a run dir: read without following links, at most MAX_SHARE_BYTES,
and each field checked; a file that fails any check counts as none (nothing here raises).
`orch status` and the web page show which jobs share a process from it, the crash-loop guard
counts the failures of one fused process's members that end together once, and placement joins
a fused group there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.attempts.field_checks import MAX_PID
from orchestrator.executors.runs_tree import FileProblem, RunTreeError, open_run_dir, read_file
from orchestrator.plans.model import ShareBase
from orchestrator.rundir_files import RunDir

MAX_SHARE_BYTES = 4096
SHARE_MODES = (ShareBase.SEQUENTIAL.value, ShareBase.FUSED.value)  # a warm process's modes
MAX_BASE_MIB = 16 * 1024 * 1024  # 16 TiB: above any card
_PROCESS = re.compile(r"[0-9A-Za-z]{1,32}-[0-9]{1,4}")  # <key16>-<slot>


@dataclass(frozen=True)
class ShareRecord:
    mode: str  # sequential | fused
    process: str  # the warm process's name, `<key16>-<slot>`
    pid: int
    base_mib: int | None  # the base's resident memory in that process; None: not measured

    def fields(self) -> dict[str, Any]:
        """The attempt's columns that hold it."""
        return {"share_mode": self.mode, "share_process": self.process, "share_pid": self.pid,
                "share_base_mib": self.base_mib}


def parse_share(raw: bytes | None) -> ShareRecord | None:
    """The record in share.json's bytes, or None where any field is missing or out of range."""
    if not raw or len(raw) > MAX_SHARE_BYTES:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    mode, process, pid, base = data.get("mode"), data.get("process"), data.get("pid"), data.get("base_mem_mib")
    if mode not in SHARE_MODES or not isinstance(process, str) or not _PROCESS.fullmatch(process):
        return None
    if isinstance(pid, bool) or not isinstance(pid, int) or not 1 <= pid <= MAX_PID:
        return None
    if base is not None and (isinstance(base, bool) or not isinstance(base, int) or not 0 < base <= MAX_BASE_MIB):
        base = None  # a bad figure is no figure: the rest still says which process it is
    return ShareRecord(str(mode), process, pid, base)


def read_share(run_dir: str | Path) -> ShareRecord | None:
    """The attempt's share.json, checked; None when absent, unreadable or invalid."""
    try:
        with open_run_dir(Path(run_dir)) as dir_fd:
            return parse_share(read_file(dir_fd, RunDir.SHARE, MAX_SHARE_BYTES))
    except (FileProblem, RunTreeError, OSError):
        return None
