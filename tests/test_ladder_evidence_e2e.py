"""OOM evidence carried across ladder rungs, end to end on a simulated card (real daemon, tmux and
SQLite): a config declared far below its need OOMs once beside another job, and its next rung is
predicted from the OOM's floor, not from the declared figure the OOM disproved."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from e2e_helpers import Orch, orch_env, requires_tmux, wait_until

pytestmark = [requires_tmux, pytest.mark.tmux]


SIM_GPUS = "1x20GiB"  # the simulated cards of the `orch` fixture (tests/conftest.py)


def test_the_rung_after_an_oom_is_predicted_from_its_floor(orch: Orch) -> None:
    # One 20 GiB card, plan 2: a 9 GiB job, then a 17 GiB config declared at 6 GiB beside it.
    orch.write_suite("steady", {"nine": {"sim_mem_gib": 9, "sim_seconds": 20}}, mem_gib=9)
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
    assert first["started_at"] < steady["ended_at"] - 5.0  # the OOM was beside it


def test_jobs_start_at_the_first_level_that_fits(tmp_path: Path) -> None:
    # 3 configs × 4 seeds whose level 0 needs 26 GiB, on two 24 GiB cards: each config OOMs at
    # most once per card; its other jobs start at the level its OOM showed they need.
    with orch_env(tmp_path, gpus="2x24GiB") as orch:
        configs = {f"wide{n}": {"sim_mem_gib": 26 + n / 5, "sim_seconds": 1.5} for n in range(3)}
        orch.write_suite("wide", configs, mem_gib=20, max_attempts=4)
        orch.submit("wide", " ".join(f"{seed}:toy" for seed in range(1, 5)))
        orch.start_daemon()
        states = orch.wait_all_done(300)
        assert set(states.values()) == {"succeeded"} and len(states) == 12, states

        rows = orch.attempts()
        jobs = {job["id"]: job for job in (orch.json("show", str(job_id)) for job_id in states)}
        ooms = Counter((jobs[a["job_id"]]["config"], a["gpu_index"]) for a in rows if a["outcome"] == "oom")
        assert ooms and max(ooms.values()) == 1, ooms
        started_higher = [job for job in jobs.values() if job["attempts"][0]["level"] > 0]
        assert started_higher, "no job started above level 0"
        for job in started_higher:
            assert job["level_note"].startswith(f"starts at level {job['attempts'][0]['level']}: level 0 ")
            assert "the cards hold" in job["level_note"]
            assert [a["outcome"] for a in job["attempts"]] == ["succeeded"]
        shown = orch.run("show", str(started_higher[0]["id"])).stdout
        assert started_higher[0]["level_note"] in shown
        # results say so too, in the row's notes of every format
        notes = [note for row in orch.json("results") for note in row["notes"]]
        for job in started_higher:
            assert f"seed {job['seed']} (job {job['id']}): {job['level_note']}" in notes
        text = orch.run("results").stdout + orch.run("results", "--format", "markdown").stdout
        assert text.count(f"(job {started_higher[0]['id']}): starts at level") == 2


def test_a_strict_ladder_fails_saying_no_exact_rung_fits(tmp_path: Path) -> None:
    # 40 GiB at level 0, about 29 GiB with checkpointing: no exact rung fits a 24 GiB card, and a
    # strict ladder never halves the batch. Fewer data workers and running alone pass the same
    # settings as checkpointing: its OOM floor proves them too large, so no third attempt is made.
    with orch_env(tmp_path, gpus="1x24GiB") as orch:
        orch.write_suite("huge", {"huge": {"sim_mem_gib": 40, "sim_seconds": 1}}, mem_gib=8, ladder="strict")
        orch.submit("huge", "1:toy")
        orch.start_daemon()
        assert orch.wait_all_done(120) == {1: "failed"}
        shown = orch.json("show", "1")
        assert [(a["level"], a["outcome"]) for a in shown["attempts"]] == [(0, "oom"), (1, "oom")]
        assert shown["reason"].startswith("no level of its ladder fits: level 2 needs ≥ ")
        assert shown["reason"].endswith("after headroom (a strict ladder: exact rungs only)")
        assert all("batch_size" not in (a["changes"] or {}) for a in shown["attempts"])
