"""What a hostile worker of the same Unix user cannot do to orch or to other attempts, on the
real daemon, tmux, SQLite and simulated GPUs (the README's reliability section names each)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import Orch, orch_env, requires_tmux
from hostile_helpers import hostile_command

pytestmark = [requires_tmux, pytest.mark.tmux]


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path / "home") as env:
        yield env


def test_a_run_dir_swapped_for_a_link_gets_nothing_written_outside(orch: Orch, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    orch.write_suite("s", {"swap": {"corrupt": "rundir_to_outside", "outside_dir": str(outside), "hold_s": 1.5}},
                     worker=hostile_command(), mem_gib=0.25, max_attempts=1)
    orch.submit("s", "1:a")
    orch.start_daemon()
    assert orch.wait_all_done(60) == {1: "failed"}
    assert sorted(p.name for p in outside.iterdir()) == []  # no exit.json, gpu_peak.json, log
    moved = next((orch.root / "runs" / "s").glob("*/attempt-1.moved"))
    assert (moved / "pid.json").is_file() and not (moved / "exit.json").exists()
    attempt = orch.attempts(1)[0]
    assert "symlink" in attempt["reason"], attempt
