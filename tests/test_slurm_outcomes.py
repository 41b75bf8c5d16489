"""What a Slurm end does to its job in state.db: a preemption and a resumed time limit are not
counted; Slurm's OUT_OF_MEMORY reruns the same level with twice the host memory (--mem)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.attempts.outcomes import complete
from orchestrator.executors.base import RemoteStatus
from orchestrator.executors.observation import Observation
from orchestrator.executors.remote_verdict import ClusterEnd, remote_end
from orchestrator.executors.slurm.time_limits import time_limit_of
from orchestrator.lifecycle import AttemptOutcome
from orchestrator.prediction.job_facts import JobShapeCache
from orchestrator.store import Store
from orchestrator.store.attempts import AttemptPlan, read_attempt, start_attempt, update_attempt
from orchestrator.store.peak_source import PredictionSource, SourceKind
from orchestrator.store.queries import get_job
from orchestrator.store.rows import Attempt, Job
from tests.test_crash_loop import submit, write_suite


def _start(store: Store, job: Job, tmp_path: Path) -> Attempt:
    plan = AttemptPlan(job_id=job.id, gpu_index=-1, gpu_uuid="cluster", level=0, level_step="as_configured",
                       changes={}, overrides={}, run_alone=False, predicted_peak_mib=1024,
                       prediction_source=PredictionSource(SourceKind.DECLARED), reserved_mib=0)
    attempt = start_attempt(store, plan, lambda n: tmp_path / "runs" / str(job.id) / str(n))
    Path(attempt.run_dir).mkdir(parents=True, exist_ok=True)
    return attempt


def _end(store: Store, attempt: Attempt, end: ClusterEnd) -> Job:
    obs = Observation(pid_record=None, exit_record={"exit_code": 143, "received": ["SIGTERM"]}, process_alive=False,
                      last_progress=None, last_progress_at=None, now_s=store.now_s())
    complete(store, attempt, obs, JobShapeCache(), lost=True, remote_end=end)
    return get_job(store, attempt.job_id)


def test_preemptions_never_use_up_max_attempts(db_path: Path, tmp_path: Path) -> None:
    plans = write_suite(tmp_path / "plans", "s", max_attempts=1)
    with Store(db_path) as store:
        (job,) = submit(store, plans, "s", 1)
        for _ in range(3):
            attempt = _start(store, job, tmp_path)
            row = _end(
                store,
                attempt,
                ClusterEnd(
                    AttemptOutcome.LOST, "Slurm job 7 was preempted (PREEMPTED)", counted=False
                ),
            )
            assert row.state == "queued", row
        assert row.max_attempts == 4  # three preemptions, none counted: one real attempt left
        attempt = _start(store, job, tmp_path)
        row = _end(store, attempt, ClusterEnd(AttemptOutcome.LOST, "Slurm job 8 ended NODE_FAIL"))
        assert row.state == "failed" and "gave up after 4 attempts" in row.reason


def test_slurms_out_of_memory_reruns_with_twice_the_host_memory(db_path: Path, tmp_path: Path) -> None:
    plans = write_suite(tmp_path / "plans", "s", max_attempts=2, slurm={"mem": "256M", "time": "5"})
    with Store(db_path) as store:
        (job,) = submit(store, plans, "s", 1)
        attempt = _start(store, job, tmp_path)
        end = ClusterEnd(AttemptOutcome.HOST_OOM, "Slurm job 9 ended OUT_OF_MEMORY", next_mem_mib=512)
        row = _end(store, attempt, end)
        assert row.state == "queued" and row.level == 0
        assert row.slurm["mem_mib"] == 512 and row.slurm["time"] == "5"
        closed = read_attempt(store, attempt.id)
        assert closed is not None and closed.outcome == AttemptOutcome.HOST_OOM
        attempt = _start(store, job, tmp_path)
        row = _end(store, attempt, end)
        assert row.state == "failed"  # counted: max_attempts 2 used up


def test_every_time_limit_counts_toward_the_cap_even_one_slurm_called_failed(db_path: Path, tmp_path: Path) -> None:
    # a resumable worker without a SIGUSR2 handler dies of the warning: Slurm says FAILED, not
    # TIMEOUT; it is the same time limit, so it counts toward max_timeouts (no endless resumes)
    plans = write_suite(tmp_path / "plans", "s", max_attempts=1, worker="python -m workers.sim --config {config}",
                        slurm={"time": "1", "max_timeouts": 1})
    (plans / "configs" / "s" / "a.yaml").write_text("sim_mem_gib: 1\nresume_from_checkpoint: null\n")
    with Store(db_path) as store:
        (job,) = submit(store, plans, "s", 1)
        first = _start(store, job, tmp_path)
        update_attempt(store, first.id, executor_state="FAILED")
        policy = time_limit_of(store, first, job)
        assert policy.can_resume and policy.timeouts_before == 0 and policy.max_timeouts == 1 and policy.limit == "1"
        row = _end(
            store,
            first,
            remote_end(first, _obs_warned(store), _failed(), True, None, policy),  # type: ignore[arg-type]
        )
        assert row.state == "queued" and row.max_attempts == 2  # resumed, not counted
        second = _start(store, job, tmp_path)
        assert time_limit_of(store, second, job).timeouts_before == 1
        end = remote_end(second, _obs_warned(store), _failed(), True, None, time_limit_of(store, second, job))
        assert isinstance(end, ClusterEnd) and end.outcome is AttemptOutcome.FAILED and "2 times" in end.reason


def _obs_warned(store: Store) -> Observation:
    return Observation(pid_record=None, exit_record={"exit_code": 140, "signal": 12, "received": ["SIGUSR2"]},
                       process_alive=False, last_progress=None, last_progress_at=None, now_s=store.now_s())


def _failed() -> RemoteStatus:
    return RemoteStatus("FAILED", "ended", "NonZeroExitCode", "7")
