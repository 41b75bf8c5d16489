"""Run dirs laid out as the daemon lays them out, for tests of what reads them."""

from __future__ import annotations

from pathlib import Path


def private_attempt_dir(tmp_path: Path) -> Path:
    """A run dir where orch's readers look: runs/SUITE/JOB/ATTEMPT under `tmp_path`, each level
    ours alone (0700), as the readers require before they trust a file there."""
    run_dir = tmp_path / "runs" / "suite" / "job" / "attempt-1"
    run_dir.mkdir(parents=True)
    for level in (tmp_path / "runs", run_dir.parent.parent, run_dir.parent, run_dir):
        level.chmod(0o700)
    return run_dir
