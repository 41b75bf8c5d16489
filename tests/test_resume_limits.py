"""A death that leaves a checkpoint is requeued without counting only while it is progress and
within the job's resume cap; a cancel stored while the end is decided wins over every requeue."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_helpers import declared_plan

from orchestrator.actions import user_actions
from orchestrator.actions.user_actions import Done, cancel_job
from orchestrator.attempts import outcomes
from orchestrator.attempts.outcomes import complete
from orchestrator.executors.observation import Observation
from orchestrator.lifecycle import JobState, KillRequest
from orchestrator.prediction.job_facts import JobShapeCache
from orchestrator.store import Store
from orchestrator.store.attempts import start_attempt
from orchestrator.store.queries import get_attempts, get_job
from orchestrator.store.rows import Attempt, Job
from tests.test_crash_loop import submit, write_suite

RESUMING = "python train.py --out {run_dir} {resume}"  # a script that takes a checkpoint


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    root.mkdir(mode=0o700)
    return root


def resumable_job(store: Store, tmp_path: Path, **settings: object) -> Job:
    write_suite(tmp_path / "plans", "mine", worker=RESUMING, **settings)
    return submit(store, tmp_path / "plans", "mine", 1)[0]


def start(store: Store, job: Job, runs: Path) -> Attempt:
    plan = declared_plan(job.id)
    attempt = start_attempt(
        store, plan, lambda n: runs / "mine" / f"{job.id:06d}-job" / f"attempt-{n}"
    )
    Path(attempt.run_dir).mkdir(parents=True, exist_ok=True)
    return attempt


def save(attempt: Attempt, step: int) -> None:
    """The attempt's worker saves checkpoint-`step` in its run dir."""
    folder = Path(attempt.run_dir) / "out" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.bin").write_text("weights")


def killed_by_itself(store: Store, attempt: Attempt) -> None:
    """The worker SIGKILLs itself (no signal reached the wrapper); the daemon records the end."""
    record = {"exit_code": -9, "signal": 9, "received": []}
    obs = Observation(
        pid_record=None,
        exit_record=record,
        process_alive=False,
        last_progress=None,
        last_progress_at=None,
        now_s=store.now_s(),
    )
    complete(store, attempt, obs, JobShapeCache())


def test_a_cancel_stored_while_the_end_is_decided_wins_over_a_resume(
    db_path: Path, tmp_path: Path, runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(db_path) as store:
        job = resumable_job(store, tmp_path)
        attempt = start(store, job, runs)  # read by the daemon's pass: no stop asked yet
        save(attempt, 10)
        real_gather = outcomes._gather
        cancels: list[Done] = []

        def the_cancel_lands_first(
            store_: Store, attempt_: Attempt, *args: object, **kwargs: object
        ) -> object:
            if not cancels:  # `orch cancel` writes its request after the daemon read the attempt
                monkeypatch.setattr(user_actions, "daemon_alive", lambda _store: 1)
                cancels.append(cancel_job(store_, attempt_.job_id))
            return real_gather(store_, attempt_, *args, **kwargs)

        monkeypatch.setattr(outcomes, "_gather", the_cancel_lands_first)
        assert attempt.kill_requested is None
        killed_by_itself(store, attempt)
        assert cancels == [Done.STOPPING]
        job = get_job(store, job.id)
        assert (job.state, job.reason) == (JobState.CANCELLED, "cancelled by user")
        (ended,) = get_attempts(store, job.id)
        assert ended.kill_requested is KillRequest.CANCEL and ended.outcome is not None
        assert "checkpoint is left to resume from" not in (ended.reason or "")
        assert job.max_attempts == 8  # nothing was requeued uncounted


def test_a_worker_printing_the_oom_killers_lines_about_itself_is_no_host_oom(
    db_path: Path, tmp_path: Path, runs: Path
) -> None:
    with Store(db_path) as store:
        job = resumable_job(store, tmp_path)
        attempt = start(store, job, runs)
        (Path(attempt.run_dir) / "stdout.log").write_text(
            "step 10 loss 0.5\n"
            "[ 812.5] Memory cgroup out of memory: Killed process 4242 (python) total-vm:987654kB\n"
            "[ 812.5] oom-kill:constraint=CONSTRAINT_MEMCG,task=python,pid=4242,uid=1000\n"
            "Killed\n"
        )
        killed_by_itself(store, attempt)
        (ended,) = get_attempts(store, job.id)
        assert (ended.outcome, ended.reason) == ("failed", "killed by SIGKILL without OOM evidence")
        job = get_job(store, job.id)
        assert job.host_steps_json == "[]"  # not moved to fewer workers or to running alone


def resume_from(store: Store, job: Job, runs: Path, checkpoint: Path) -> Attempt:
    """The job's next attempt, resuming from `checkpoint` (attempt n's)."""
    n = int(checkpoint.parents[1].name.removeprefix("attempt-"))
    plan = declared_plan(job.id, resumed_from_attempt=n, resumed_from_checkpoint=str(checkpoint))
    attempt = start_attempt(
        store, plan, lambda k: runs / "mine" / f"{job.id:06d}-job" / f"attempt-{k}"
    )
    Path(attempt.run_dir).mkdir(parents=True, exist_ok=True)
    return attempt


def test_a_checkpoint_at_the_step_resumed_from_is_no_progress(
    db_path: Path, tmp_path: Path, runs: Path
) -> None:
    with Store(db_path) as store:
        job = resumable_job(store, tmp_path, max_attempts=2)
        first = start(store, job, runs)
        save(first, 10)
        killed_by_itself(store, first)
        job = get_job(store, job.id)  # it got somewhere: resumed, not counted
        assert (job.state, job.resumes, job.counted_attempts, job.max_attempts) == (
            JobState.QUEUED,
            1,
            0,
            2,
        )
        checkpoint = Path(first.run_dir) / "out" / "checkpoint-10"
        for n in (2, 3):  # each saves checkpoint-10 again and dies: counted
            attempt = resume_from(store, job, runs, checkpoint)
            save(attempt, 10)
            killed_by_itself(store, attempt)
            job = get_job(store, job.id)
            assert (job.resumes, job.counted_attempts, job.max_attempts) == (1, n - 1, 2)
            checkpoint = Path(attempt.run_dir) / "out" / "checkpoint-10"
        assert job.state is JobState.FAILED and "checkpoint is left to resume from" in (
            job.reason or ""
        )


def test_a_higher_step_each_time_is_resumed_up_to_max_resumes(
    db_path: Path, tmp_path: Path, runs: Path
) -> None:
    with Store(db_path) as store:
        job = resumable_job(store, tmp_path, max_attempts=1, max_resumes=3)
        assert job.max_resumes == 3
        attempt = start(store, job, runs)
        for step in range(10, 100, 10):
            save(attempt, step)
            killed_by_itself(store, attempt)
            job = get_job(store, job.id)
            if job.state is not JobState.QUEUED:
                break
            attempt = resume_from(
                store, job, runs, Path(attempt.run_dir) / "out" / f"checkpoint-{step}"
            )
        assert (job.state, job.attempt_count, job.resumes, job.max_attempts) == (
            JobState.FAILED,
            4,
            3,
            1,
        )
        assert job.reason == (
            "killed by SIGKILL again after 3 resumes from a checkpoint, the most its suite "
            "allows (max_resumes: 3)"
        )


def test_max_resumes_is_a_small_whole_number(tmp_path: Path) -> None:
    from orchestrator.errors import PlanError
    from orchestrator.plans import load_suite

    write_suite(tmp_path / "plans", "mine", worker=RESUMING)
    assert load_suite("mine", tmp_path / "plans").max_resumes == 8  # the default, under ten
    for bad in (-1, 101, "3", True):
        write_suite(tmp_path / "plans", "mine", worker=RESUMING, max_resumes=bad)
        with pytest.raises(PlanError, match="max_resumes"):
            load_suite("mine", tmp_path / "plans")


def test_a_refused_resume_is_retried_fresh_not_failed(
    db_path: Path, tmp_path: Path, runs: Path
) -> None:
    from orchestrator.scheduling.launching import resume_point

    def refused(attempt: Attempt, said: str) -> None:
        (Path(attempt.run_dir) / "stdout.log").write_text(f"ConfigError: {said}\n")
        obs = Observation(
            pid_record=None,
            exit_record={"exit_code": 4, "signal": None, "received": []},
            process_alive=False,
            last_progress=None,
            last_progress_at=None,
            now_s=store.now_s(),
        )
        complete(store, attempt, obs, JobShapeCache())

    with Store(db_path) as store:
        job = resumable_job(store, tmp_path)
        first = start(store, job, runs)
        save(first, 30)
        killed_by_itself(store, first)
        checkpoint = resume_point(store, get_job(store, job.id)).checkpoint
        assert checkpoint is not None and checkpoint.step == 30
        resumed = resume_from(store, get_job(store, job.id), runs, checkpoint.path)
        refused(
            resumed,
            f"resume_from_checkpoint {checkpoint.path}: not a checkpoint folder (no state.json)",
        )
        job = get_job(store, job.id)
        assert (job.state, job.fresh_after_attempt, job.reason) == (JobState.QUEUED, 2, None)
        assert resume_point(store, job).checkpoint is None  # the next attempt starts fresh
        fresh = start(store, job, runs)
        refused(fresh, "unknown key 'lr'")  # a config error of a fresh start is the job's own
        job = get_job(store, job.id)
        assert (
            job.state is JobState.FAILED
            and job.reason == "config error: ConfigError: unknown key 'lr' (not retryable)"
        )


def test_a_cancel_stored_while_a_failed_launch_is_recorded_wins_over_its_requeue(
    db_path: Path, tmp_path: Path, runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.attempts.outcomes import fail_before_start

    with Store(db_path) as store:
        job = resumable_job(store, tmp_path)
        attempt = start(store, job, runs)
        real_close = outcomes.close_attempt
        cancels: list[Done] = []

        def the_cancel_lands_first(*args: object, **kwargs: object) -> bool:
            if not cancels:  # `orch cancel` writes its request after the attempt was read
                monkeypatch.setattr(user_actions, "daemon_alive", lambda _store: 1)
                cancels.append(cancel_job(store, job.id))
            return real_close(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(outcomes, "close_attempt", the_cancel_lands_first)
        fail_before_start(store, attempt, "tmux: cannot open a window")
        assert cancels == [Done.STOPPING]
        job = get_job(store, job.id)
        assert (job.state, job.reason) == (JobState.CANCELLED, "cancelled by user")


def test_the_job_page_says_attempts_and_resumes_against_their_limits(
    db_path: Path, tmp_path: Path
) -> None:
    from orchestrator.web.views import job_view

    with Store(db_path) as store:
        job = resumable_job(store, tmp_path, max_attempts=4, max_resumes=3)
        assert "attempt 0 of at most 4, resume 0 of at most 3" in job_view(store, job.id)
