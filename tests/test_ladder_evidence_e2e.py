"""OOM evidence carried across ladder rungs, end to end on a simulated card (real daemon, tmux and
SQLite): a config declared far below its need OOMs once beside another job, and its next rung is
predicted from the OOM's floor, not from the declared figure the OOM disproved."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import Orch, orch_env, requires_tmux, wait_until

pytestmark = [requires_tmux, pytest.mark.tmux]


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path, gpus="1x20GiB") as env:
        yield env


def test_the_rung_after_an_oom_is_predicted_from_its_floor(orch: Orch) -> None:
    # One 20 GiB card, plan 2: a 9 GiB job, then a 17 GiB config declared at 6 GiB beside it.
    orch.write_suite("steady", {"nine": {"sim_mem_gib": 9, "sim_seconds": 8}}, mem_gib=9)
    orch.write_suite("big", {"big": {"sim_mem_gib": 17, "sim_seconds": 2}}, mem_gib=6)
    orch.submit("steady", "1:toy", "--gpu-plan", "2")
    orch.start_daemon()
    wait_until(lambda: max((a["held_mib"] or 0) for a in orch.attempts(1) or [{"held_mib": 0}]) >= 9 * 1024 - 64, 60,
               "the 9 GiB job to hold its memory")
    orch.submit("big", "1:toy")
    assert orch.wait_all_done(150) == {1: "succeeded", 2: "succeeded"}

    assert [a["outcome"] for a in orch.json("show", "1")["attempts"]] == ["succeeded"]
    first, second = orch.json("show", "2")["attempts"]  # one OOM, then success
    assert first["outcome"] == "oom" and first["level"] == 0 and first["predicted_peak_mib"] == 6 * 1024
    # checkpointing (exact) saves what the sim says; nothing had measured it yet, so the floor
    # itself is the figure: above the disproved 6 GiB, and too much to share the card with 9 GiB
    assert second["outcome"] == "succeeded" and second["level"] == 1
    assert second["predicted_peak_mib"] > first["predicted_peak_mib"]
    assert second["predicted_peak_mib"] >= first["peak_mib"]
    assert "OOM floor" in second["prediction_source"]
    steady = orch.json("show", "1")["attempts"][0]
    assert second["started_at"] >= steady["ended_at"] - 1.0  # it waited for the card, not beside the 9 GiB job
