"""A busy Slurm controller: a transient sbatch refusal requeues without counting, and nothing
is submitted while the executor backs off. The dispatch path is real (state.db, run dirs);
only the refusal is the executor's word."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator.clock import FakeClock
from orchestrator.errors import ClusterBusy
from orchestrator.executors.base import Executor, LaunchHandle, LaunchSpec, RemoteStatus
from orchestrator.executors.slurm.executor import SlurmExecutor, SlurmOptions
from orchestrator.executors.slurm.parse import is_transient_refusal
from orchestrator.lifecycle import AttemptOutcome, JobState
from orchestrator.prediction.job_facts import JobShapeCache
from orchestrator.scheduling.cluster_dispatch import schedule_remote
from orchestrator.scheduling.launching import DispatchContext
from orchestrator.scheduling.packing.types import PackingPolicy
from orchestrator.store import Store
from orchestrator.store.queries import get_attempts, get_job
from orchestrator.store.rows import Attempt, Job
from tests.test_crash_loop import paused, submit, write_suite


class RefusingSlurm(Executor):
    """sbatch's answer while slurmctld is overloaded, every time."""

    name = "slurm"
    remote = True

    def __init__(self) -> None:
        self.asked = 0

    def submit(self, spec: LaunchSpec) -> LaunchHandle:
        self.asked += 1
        raise ClusterBusy("Slurm is busy, sbatch refused job for now: Socket timed out on send/recv operation")

    def observe(self, attempts: Sequence[tuple[Attempt, Job]]) -> dict[int, RemoteStatus] | None:
        return {}  # nothing was ever submitted

    def stop(self, attempt: Attempt, job: Job) -> None:
        raise AssertionError("nothing was submitted to stop")


def test_busy_refusals_are_known() -> None:
    assert is_transient_refusal("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation")
    assert is_transient_refusal("sbatch: error: Resource temporarily unavailable")
    assert not is_transient_refusal(
        "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified"
    )


def test_a_transient_sbatch_refusal_requeues_without_counting_or_pausing(db_path: Path, tmp_path: Path) -> None:
    plans = write_suite(tmp_path / "plans", "busy", max_attempts=1)
    ctx = DispatchContext(runs_dir=tmp_path / "runs", policy=PackingPolicy(), worker_env={})
    executor = RefusingSlurm()
    with Store(db_path) as store:
        (job,) = submit(store, plans, "busy", 1)
        for _ in range(4):  # more refusals than the crash-loop guard's 3 and than max_attempts 1
            schedule_remote(  # type: ignore[arg-type]
                store, executor, ctx, JobShapeCache(), draining=False, max_in_queue=4
            )
        after = get_job(store, job.id)
        outcomes = [a.outcome for a in get_attempts(store, job.id)]
        assert executor.asked == 4 and outcomes == [AttemptOutcome.LOST] * 4
        assert after.state == JobState.QUEUED and after.max_attempts == 5  # none of the 4 counted
        assert paused(store) == {}


def test_nothing_is_submitted_while_slurm_backs_off(db_path: Path, tmp_path: Path) -> None:
    executor = SlurmExecutor.__new__(SlurmExecutor)  # its state only: no cluster is asked here
    executor.options, executor.clock, executor._failures, executor._next_poll_at = (
        SlurmOptions(),
        FakeClock(0.0),
        0,
        0.0,
    )
    assert executor.submit_hold() is None
    executor._backoff("Socket timed out")
    executor._backoff("Socket timed out")
    assert executor.submit_hold() == "Slurm did not answer lately: next try in 4 s"
    plans = write_suite(tmp_path / "plans", "held")
    ctx = DispatchContext(runs_dir=tmp_path / "runs", policy=PackingPolicy(), worker_env={})
    with Store(db_path) as store:
        (job,) = submit(store, plans, "held", 1)
        assert schedule_remote(store, executor, ctx, JobShapeCache(), draining=False, max_in_queue=4) == 0
        after = get_job(store, job.id)
        assert after.state == JobState.QUEUED and "Slurm did not answer lately" in (after.wait_reason or "")
    executor.clock.advance(5)
    assert executor.submit_hold() is None
