"""A start on trial end to end, with `--mps` simulated on a simulated card: CLI, daemon, tmux,
SQLite and the sim worker, which holds itself to its fence as a fenced MPS client is held.

A memory family on one 24 GiB card: b256 (14 GiB) runs; the first b128 job is
predicted at the b256 peak (its family has measured only b256), which does not fit beside it, and
may start on trial into the 7,783 MiB left (10,240 free less 2,457 of headroom), fenced there,
since half the b256 peak (its least) fits."""

from __future__ import annotations

import re

import pytest
from e2e_helpers import Orch, requires_tmux

pytestmark = [requires_tmux, pytest.mark.tmux]

SIM_GPUS = "1x24GiB"
ROOM_MIB = 24 * 1024 - 14 * 1024 - 2457


def _sweep(orch: Orch, base_gib: float) -> tuple[list[dict], list[dict]]:  # type: ignore[type-arg]
    """b256 then b128, one seed each, under a daemon with --mps: each job's attempts."""
    common = {"sim_mem_gib": 14, "sim_base_gib": base_gib, "sim_reference_batch": 256, "sim_ramp_s": 0.5}
    orch.write_suite("tr", {"b256": {**common, "batch_size": 256, "sim_seconds": 15},
                            "b128": {**common, "batch_size": 128, "sim_seconds": 3}},
                     mem_gib=3, max_attempts=1)  # fmt: skip
    orch.submit("tr", "1:glue_rte", "--gpu-plan", "4")
    started = orch.run("daemon", "start", "--poll", "0.2", "--mps").stdout
    said = re.search(r"daemon started \(pid (\d+)\)", started)
    assert said, started
    orch.remember_daemon(int(said.group(1)))
    assert set(orch.wait_all_done(120).values()) == {"succeeded"}, orch.attempts()
    b256, b128 = (orch.json("show", str(job.id))["attempts"] for job in orch.jobs())
    return b256, b128


@pytest.mark.slow
def test_a_member_whose_least_fits_starts_beside_the_larger_one_on_trial(orch: Orch) -> None:
    # base 0.5 GiB: b128 peaks at 7,424 MiB, under its fence
    b256, b128 = _sweep(orch, 0.5)
    assert [a["trial_fence_mib"] for a in b256] == [None]
    assert [(a["outcome"], a["level"], a["trial_fence_mib"]) for a in b128] == [("succeeded", 0, ROOM_MIB)]
    assert b128[0]["started_at"] < b256[0]["ended_at"]  # beside it, not after it
    assert b128[0]["peak_mib"] <= ROOM_MIB
    started = [e.message for e in orch.events("start") if "on trial" in e.message]
    assert len(started) == 1 and f"started on trial in {ROOM_MIB / 1024:.1f} GiB, its MPS fence" in started[0]
    assert any("MPS simulated for GPU 0" in e.message for e in orch.events("daemon"))
    job = orch.jobs()[1].id
    assert f"started on trial in {ROOM_MIB / 1024:.1f} GiB, its MPS fence" in orch.run("show", str(job)).stdout


@pytest.mark.slow
def test_an_oom_under_a_trials_fence_is_requeued_at_its_level_uncounted_and_never_tried_again(orch: Orch) -> None:
    # base 5.6 GiB: b128 peaks at 10,035 MiB, past its fence; `max_attempts: 1`, so a counted
    # OOM would have failed the job
    b256, b128 = _sweep(orch, 5.6)
    assert [(a["outcome"], a["level"], a["trial_fence_mib"]) for a in b128] == [
        ("oom", 0, ROOM_MIB), ("succeeded", 0, None)]
    assert b128[1]["started_at"] >= b256[0]["ended_at"] - 1.0  # at its prediction: after b256 left room
    said = [e.message for e in orch.events() if "started into on trial" in e.message]
    assert len(said) == 1 and "requeued unchanged, not counted" in said[0], said
    rows = orch.json("results", "--suite", "tr")
    shown = orch.run("results", "--suite", "tr").stdout
    assert "†" not in shown and "‡" not in shown, shown  # the same level ran again: no mark
    assert rows, rows
