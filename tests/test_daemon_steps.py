"""The daemon's pass as its list of steps, on a real daemon (sim GPUs, a real state.db): the
first step that ends the pass ends it, and the steps after it do not run."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.daemon.loop import AfterStep, Pass
from orchestrator.store.control import request_daemon_stop
from tests.clock_daemon import clock_daemon


def _spy(monkeypatch: pytest.MonkeyPatch, daemon: object, names: list[str], ran: list[str]) -> None:
    for name in names:
        step = getattr(daemon, name)

        def recorded(this_pass: Pass, step=step, name=name) -> AfterStep:  # type: ignore[no-untyped-def]
            ran.append(name)
            return step(this_pass)

        monkeypatch.setattr(daemon, name, recorded)


STEPS = ["_check_database", "_read_control", "_check_disk", "_read_gpus", "_reconcile", "_end_when_drained",
         "_read_gpus_again", "_schedule_pass", "_record_pass", "_watch_exit_files"]


def test_a_pass_runs_every_step_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with clock_daemon(tmp_path, monkeypatch) as cd:
        ran: list[str] = []
        _spy(monkeypatch, cd.daemon, STEPS, ran)
        assert cd.daemon.tick() is False
        assert ran == STEPS


def test_a_drained_daemon_with_nothing_running_ends_the_pass_before_scheduling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with clock_daemon(tmp_path, monkeypatch) as cd:
        request_daemon_stop(cd.daemon.store, drain=True)
        ran: list[str] = []
        _spy(monkeypatch, cd.daemon, STEPS, ran)
        assert cd.daemon.tick() is True
        assert ran == STEPS[:STEPS.index("_end_when_drained") + 1]


def test_a_stop_request_ends_the_pass_before_anything_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with clock_daemon(tmp_path, monkeypatch) as cd:
        request_daemon_stop(cd.daemon.store)
        ran: list[str] = []
        _spy(monkeypatch, cd.daemon, STEPS, ran)
        assert cd.daemon.tick() is True
        assert ran == ["_check_database", "_read_control"]
