"""The attempt watcher's one path, on a real state.db with an executor the test answers for:
an attempt orch keeps failing to check is given up on wherever it runs, and only a finished
attempt teaches its shape's host memory."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator.attempts.reconcile import Verdict
from orchestrator.attempts.resource_use import ResourceTracker
from orchestrator.clock import FakeClock
from orchestrator.daemon.disk_hold import DiskHold
from orchestrator.daemon.settings import MAX_ATTEMPT_ERRORS, DaemonSettings
from orchestrator.daemon.watcher import AttemptWatcher, Look
from orchestrator.executors.base import (
    Executor,
    LaunchHandle,
    LaunchSpec,
    LocalExecutor,
    RemoteStatus,
)
from orchestrator.executors.observation import Observation
from orchestrator.lifecycle import AttemptOutcome
from orchestrator.scheduling.state import SchedulerState
from orchestrator.store import Store
from orchestrator.store.attempts import update_attempt
from orchestrator.store.queries import get_attempts, get_job
from orchestrator.store.resources import read_host_shapes
from orchestrator.store.rows import Attempt, Job
from tests.test_crash_loop import submit, write_suite
from tests.test_slurm_outcomes import _start


class AnsweredCluster(Executor):
    """A cluster whose word on each attempt the test sets, and which records its cancels."""

    name = "slurm"
    remote = True

    def __init__(self) -> None:
        self.state = "RUNNING"
        self.stopped: list[int] = []

    def submit(self, spec: LaunchSpec) -> LaunchHandle:
        raise AssertionError("nothing is submitted here")

    def observe(self, attempts: Sequence[tuple[Attempt, Job]]) -> dict[int, RemoteStatus]:
        kind = "running" if self.state == "RUNNING" else "ended"
        return {a.id: RemoteStatus(self.state, kind, job_id="42") for a, _ in attempts}

    def stop(self, attempt: Attempt, job: Job) -> None:
        self.stopped.append(attempt.id)


class HereOnly(LocalExecutor):
    name = "subprocess"

    def submit(self, spec: LaunchSpec) -> LaunchHandle:
        raise AssertionError("nothing is submitted here")


def _watcher(store: Store, executor: Executor, tmp_path: Path) -> AttemptWatcher:
    clock = FakeClock()
    disk = DiskHold(store, clock, tmp_path / "runs", DaemonSettings(db_path=tmp_path / "state.db"))
    return AttemptWatcher(store, clock, executor, SchedulerState(), tmp_path / "runs", ResourceTracker(None), disk)


def test_a_cluster_attempt_that_cannot_be_checked_is_cancelled_then_closed_once_the_cluster_says_it_ended(
    db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    plans = write_suite(tmp_path / "plans", "s", max_attempts=1)
    cluster = AnsweredCluster()
    with Store(db_path) as store:
        (job,) = submit(store, plans, "s", 1)
        attempt = _start(store, job, tmp_path)
        update_attempt(store, attempt.id, executor="slurm", executor_id="42")
        watcher = _watcher(store, cluster, tmp_path)

        def broken(*args: object) -> Look:
            raise ValueError("unreadable record")

        monkeypatch.setattr(watcher, "_look_elsewhere", broken)
        for _ in range(MAX_ATTEMPT_ERRORS + 2):
            assert watcher.reconcile(()) == 1  # given up on, cancelled, but Slurm still runs it
        assert cluster.stopped == [attempt.id]  # one scancel, not one per pass
        cluster.state = "CANCELLED"
        assert watcher.reconcile(()) == 0
        (closed,) = get_attempts(store, job.id)
        assert closed.outcome is AttemptOutcome.FAILED and "unreadable record" in (closed.reason or "")
        assert get_job(store, job.id).state.value == "failed"


def test_only_a_finished_attempt_teaches_its_shapes_host_memory(
    db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    plans = write_suite(tmp_path / "plans", "s", max_attempts=2)
    with Store(db_path) as store:
        (job,) = submit(store, plans, "s", 1)
        watcher = _watcher(store, HereOnly(), tmp_path)
        ended = Observation(pid_record=None, exit_record=None, process_alive=False, last_progress=None,
                            last_progress_at=None, now_s=store.now_s())
        for verdict in (Verdict.LOST, Verdict.FINISHED):
            attempt = _start(store, get_job(store, job.id), tmp_path)
            update_attempt(store, attempt.id, host_peak_mib=3000 if verdict is Verdict.LOST else 5000)
            monkeypatch.setattr(watcher, "_look_here", lambda a, j, v=verdict: Look(
                a, ended if v is Verdict.LOST else Observation(**{**ended.__dict__, "exit_record": {"exit_code": 0}}),
                v, elsewhere=False, stoppable=()))
            assert watcher.reconcile(()) == 0
            learned = read_host_shapes(store)
            if verdict is Verdict.LOST:
                assert learned == {}, "a lost attempt's partial peak was learned"
        assert list(learned.values()) == [5000]
