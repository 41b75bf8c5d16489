"""The dashboard's retry lines: a ladder move, or a host step taken at the same level."""

from __future__ import annotations

from orchestrator.cli.status.lines import retry_move


def test_a_ladder_move_shows_both_levels() -> None:
    assert retry_move({"from_level": 0, "to_level": 1, "why": "oom"}) == "level 0 -> 1"


def test_a_host_step_names_what_it_changed_not_a_level_move() -> None:
    step = {"level": 0, "step": "data_workers", "changes": {"num_data_workers": 0}, "run_alone": False}
    got = retry_move({"from_level": 0, "to_level": 0, "host_step": step})
    assert got == "level 0 + host step data_workers: num_data_workers=0"
    alone = {"level": 2, "step": "run_alone", "changes": {}, "run_alone": True}
    assert (
        retry_move({"from_level": 2, "to_level": 2, "host_step": alone})
        == "level 2 + host step run_alone: run alone"
    )
