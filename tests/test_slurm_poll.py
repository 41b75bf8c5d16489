"""How often the Slurm executor asks Slurm, and what an unanswered question means. Slurm's
commands are replaced by recorded answers (its real behaviour is in test_slurm_e2e.py); the
clock is a fake one, so the period is checked without waiting for it."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from rows_helpers import attempt_of, job_of

from orchestrator.cli.daemon.setup import make_daemon_executor
from orchestrator.clock import FakeClock
from orchestrator.daemon.options import DaemonOptions
from orchestrator.executors import factory
from orchestrator.executors.slurm import executor as slurm
from orchestrator.executors.slurm.executor import SlurmExecutor, SlurmOptions

Answer = Callable[[tuple[str, ...]], subprocess.CompletedProcess[str]]


def _executor(
    monkeypatch: pytest.MonkeyPatch, answer: Answer, clock: FakeClock, **options: float,
) -> tuple[SlurmExecutor, list[tuple[str, ...]]]:
    asked: list[tuple[str, ...]] = []

    def run(*argv: str, timeout_s: float = 0.0) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        return answer(argv)

    monkeypatch.setattr(slurm, "_run", run)
    executor = SlurmExecutor.__new__(SlurmExecutor)
    executor.options, executor.clock, executor.user, executor.accounting = SlurmOptions(**options), clock, "u", False
    executor._failures, executor._next_poll_at, executor._polled_at = 0, 0.0, -math.inf
    executor._soon, executor._statuses, executor._gone_at, executor._ended = set(), {}, {}, {}
    executor.answered_now = False
    return executor, asked


def _done(stdout: str = "", rc: int = 0, stderr: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], rc, stdout, stderr)


ATTEMPT = attempt_of(id=1, job_id=3, n=1, executor="slurm", executor_id="42")
JOB = job_of(id=3, suite="s")


def test_slurm_is_asked_on_its_own_period_and_sooner_after_a_submission(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(0.0)
    executor, asked = _executor(monkeypatch, lambda argv: _done("42|orch-s-3-a1|RUNNING|None|1G\n"), clock)
    assert executor.options.poll_s == 30.0  # the default period (docs/slurm.md)

    def squeues() -> list[tuple[str, ...]]:
        return [a for a in asked if a[0] == "squeue"]

    for second in range(121):  # a daemon pass every second for two minutes
        clock.advance(1.0 if second else 0.0)
        statuses = executor.observe([(ATTEMPT, JOB)])
        assert statuses is not None and statuses[1].state == "RUNNING"
    assert len(squeues()) == 5  # at 0, 30, 60, 90, 120 s: every pass in between got the last answer
    assert all("--jobs=42" in a for a in squeues())  # our job only, never the whole queue
    executor._after_submit()
    for _ in range(20):
        clock.advance(1.0)
        executor.observe([(ATTEMPT, JOB)])
    assert len(squeues()) == 5 + 3  # 2, 6 and 14 s after the submission


def test_an_unanswered_lookup_of_an_ended_job_concludes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(0.0)
    slurm_up = {"scontrol": False}

    def answer(argv: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "squeue":
            return _done("")  # the job has left the queue
        if not slurm_up["scontrol"]:
            raise subprocess.TimeoutExpired(argv, 20)
        return _done("JobId=42 JobName=orch-s-3-a1 JobState=COMPLETED Reason=None MinMemoryNode=1G\n")

    executor, _asked = _executor(monkeypatch, answer, clock, poll_s=30.0, exit_grace_s=60.0)
    assert executor.observe([(ATTEMPT, JOB)]) == {}  # no word on it: neither UNKNOWN nor lost
    slurm_up["scontrol"] = True
    clock.advance(30.0)
    (status,) = executor.observe([(ATTEMPT, JOB)]).values()  # type: ignore[union-attr]
    # its exit.json may be on its way
    assert (status.state, status.kind, status.settled) == ("COMPLETED", "ended", False)
    clock.advance(60.0)
    (status,) = executor.observe([(ATTEMPT, JOB)]).values()  # type: ignore[union-attr]
    assert status.settled and status.mem_mib == 1024  # the grace is over: now its absence means something


def test_the_daemon_asks_slurm_every_30_s_unless_slurm_poll_says_otherwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    made: list[SlurmOptions] = []

    def make_executor(kind: str, socket_name: str, options: SlurmOptions, gpu_mib: int | None) -> None:
        made.append(options)

    monkeypatch.setattr(factory, "make_executor", make_executor)
    probe = SimpleNamespace(snapshot=lambda: [])
    for given in ({}, {"slurm_poll_s": 10.0}):
        options = DaemonOptions(executor_kind="slurm", shard_mib=1024, db_path=tmp_path / "state.db", **given)
        make_daemon_executor(options, probe)  # type: ignore[arg-type]
    assert [options.poll_s for options in made] == [30.0, 10.0]
