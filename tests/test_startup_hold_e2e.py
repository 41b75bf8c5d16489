"""The daemon learns a start-up's hold from its own GPU readings before the first step: a real
daemon, tmux and a simulated card; the sim worker holds its base alone through `sim_startup_s`,
then its peak from its first step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import Orch, orch_env, requires_tmux, wait_until

from orchestrator.prediction.startup import HOLD_LEAD_S
from orchestrator.store.startups import read_startups

pytestmark = [requires_tmux, pytest.mark.tmux]


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path, gpus="1x24GiB") as env:
        yield env


def test_the_hold_is_the_base_held_before_the_first_steps_peak(orch: Orch) -> None:
    startup_s = HOLD_LEAD_S + 4.0  # readings before the lead, then the peak at the first step
    orch.write_suite("hold", {"base": {"sim_mem_gib": 6, "sim_base_gib": 0.75, "sim_startup_s": startup_s,
                                       "sim_ramp_s": 0.2, "sim_seconds": 1}}, mem_gib=7)  # fmt: skip
    orch.submit("hold", "1:toy")
    orch.start_daemon()
    wait_until(lambda: orch.all_done(), 90, "the job to end")
    learned = orch.read(read_startups)
    (startup,) = learned.values()
    assert startup.held_mib == 768  # the base, not the 6 GiB peak the last reading before its first step held
    assert startup.seconds >= startup_s


def test_a_job_started_ahead_of_its_memory_says_so_in_its_start_event(orch: Orch) -> None:
    """With `--overlap`, a job that cannot fit beside the running one starts its start-up while
    that one finishes, and its start event says it started ahead (nothing else showed it)."""
    # a job may start up to 15 s ahead; the end's margin (a quarter of 6 s plus 5 s) leaves a window
    # of about 8 s in which a start is ahead, wide for a daemon passing every 0.2 s on a loaded machine
    startup_s = HOLD_LEAD_S + 15.0
    orch.write_suite("ahead", {"base": {"sim_mem_gib": 14, "sim_base_gib": 0.5, "sim_startup_s": startup_s,
                                        "sim_ramp_s": 0.2, "sim_seconds": 6, "sim_exit_s": 0.5}},
                     mem_gib=15)  # fmt: skip
    orch.submit("ahead", "1:toy 2:toy 3:toy", "--gpu-plan", "2")
    orch.env["ORCH_OVERLAP"] = "1"
    orch.start_daemon()
    assert set(orch.wait_all_done(150).values()) == {"succeeded"}
    starts = [e.message for e in orch.events("start")]
    # three jobs, each started once; on a loaded machine a job started ahead may still find its
    # predecessor holding the card when its start-up ends (the simulated card then fails it out of
    # memory and it is retried, as on a real one): a retry adds a start, which is not the point here
    assert len(starts) >= 3 and "started ahead" not in starts[0]  # the first: nothing learned yet
    assert any("started ahead (--overlap)" in message for message in starts[1:]), starts
    assert "overlap" in orch.json("daemon", "status")["modes"]
