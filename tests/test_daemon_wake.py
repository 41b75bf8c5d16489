"""A freed slot is handed on when the wrapper pokes the daemon, not at its next periodic pass:
real daemon, tmux, SQLite and sim GPUs, with a poll far longer than the whole sweep."""

from __future__ import annotations

import itertools
import stat
import subprocess
from pathlib import Path

import pytest
from e2e_helpers import orch_env, requires_tmux, wait_until

pytestmark = [requires_tmux, pytest.mark.tmux]

POLL_S = 60.0  # no periodic pass after the first while the sweep runs


def test_an_ended_attempt_hands_its_slot_on_at_once(tmp_path: Path) -> None:
    with orch_env(tmp_path, gpus="1x24GiB") as orch:
        orch.write_suite("quick", {"quick": {"sim_mem_gib": 2, "sim_seconds": 0.3, "sim_ramp_s": 0.1}}, mem_gib=3)
        orch.submit("quick", "1:glue_rte 2:glue_rte 3:glue_rte", "--gpu-plan", "1")
        orch.start_daemon(poll_s=POLL_S)
        assert stat.S_ISFIFO((tmp_path / "runs" / ".wake").lstat().st_mode)
        states = orch.wait_all_done(POLL_S / 2)  # three jobs on one slot: two hand-offs by poke
        assert set(states.values()) == {"succeeded"}
        attempts = orch.attempts()
        assert len(attempts) == 3
        for ended, started in itertools.pairwise(attempts):
            assert started["started_at"] >= ended["ended_at"] - 1.0  # one slot: one at a time
            assert started["started_at"] - ended["ended_at"] < POLL_S / 4
        # the windows of ended attempts are still closed (after the next worker's launch)
        def windows() -> list[str]:
            listed = subprocess.run(["tmux", "-L", orch.socket, "list-windows", "-t", "orch", "-F", "#{window_name}"],
                                    capture_output=True, text=True, check=False)
            return listed.stdout.split()

        wait_until(lambda: windows() == ["orch"], 10, "only the session's own window left")
        orch.stop_daemon()
