"""Telling a full disk from a failing job (pure), and the free-space reading."""

from __future__ import annotations

import errno
from pathlib import Path

from orchestrator.attempts.classify import Classification
from orchestrator.attempts.disk_space import (
    DiskState,
    disk_full_evidence,
    disk_state,
    is_disk_full_error,
)
from orchestrator.attempts.next_step import disk_full_cause
from orchestrator.lifecycle import AttemptOutcome

FAILED = Classification(AttemptOutcome.FAILED, "exit code 1")


def test_evidence_in_a_log_tail_or_a_result_error() -> None:
    log = "step 3\nTraceback (most recent call last):\nOSError: [Errno 28] No space left on device\n"
    assert disk_full_evidence(None, log) == "OSError: [Errno 28] No space left on device"
    assert disk_full_evidence("write failed: Disk quota exceeded") is not None
    assert disk_full_evidence("KeyError: 'label'", "all fine") is None
    assert is_disk_full_error(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full_error(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not is_disk_full_error(OSError(errno.EACCES, "Permission denied"))


def test_only_failed_or_lost_attempts_orch_did_not_stop_are_put_down_to_the_disk() -> None:
    log = "OSError: [Errno 28] No space left on device"
    assert disk_full_cause(FAILED, None, False, log, None, None)
    assert disk_full_cause(Classification(AttemptOutcome.LOST, "no exit record"), None, True, "", None, None)
    assert disk_full_cause(FAILED, None, False, "ValueError: bad", None, None) is None
    assert disk_full_cause(FAILED, "hung", True, log, None, None) is None  # orch killed it: not the disk
    assert (
        disk_full_cause(
            Classification(AttemptOutcome.OOM, "CUDA out of memory"), None, True, log, None, None
        )
        is None
    )


def test_disk_state_levels(tmp_path: Path) -> None:
    assert DiskState("/x", 10, 256, 5120).level == "full"
    assert DiskState("/x", 1000, 256, 5120).level == "low"
    assert DiskState("/x", 10_000, 256, 5120).level == "ok"
    assert DiskState("/x", None, 256, 5120).level == "ok"  # unreadable: never blocks the sweep
    state = disk_state(tmp_path / "runs" / "not-yet", 0, 0)  # the nearest existing dir is read
    assert state.free_mib is not None and state.level == "ok"
