"""The launch grace of a cluster submission that went unanswered is measured on the daemon's
monotonic clock: a wall-clock step neither declares a launch on its way lost nor keeps a lost
one waiting. An attempt adopted after a restart adds the time before this daemon started, taken
from the stored wall times only where that gap is sane."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rows_helpers import attempt_of
from store_helpers import declared_plan

from orchestrator.attempts.silence import Silences
from orchestrator.clock import FakeClock
from orchestrator.executors.base import RemoteStatus
from orchestrator.executors.launch_age import MAX_TRUSTED_GAP_S, LaunchAge, launch_age
from orchestrator.executors.observation import LAUNCH_GRACE_S, Observation
from orchestrator.executors.remote_verdict import ClusterEnd, remote_end
from orchestrator.lifecycle import AttemptOutcome
from orchestrator.plans import expand_jobs, load_suite, parse_pairs
from orchestrator.rundir_files import RunDir
from orchestrator.store import Store
from orchestrator.store.attempts import last_attempt_id, start_attempt, update_attempt
from orchestrator.store.jobs import submit_jobs
from orchestrator.store.queries import get_attempts, get_job
from orchestrator.store.rows import Attempt, Job
from tests.test_crash_loop import submit, write_suite
from tests.test_slurm_outcomes import _start
from tests.test_watcher import AnsweredCluster, _watcher

PLANS = Path(__file__).resolve().parents[1] / "plans"
HOUR_S = 3600.0
CLAIMED_AT_S = 1_700_000_000.0  # wall time stored at the claim


def unanswered(**fields: object) -> Attempt:
    """A live attempt whose sbatch timed out: submitted (executor recorded), no Slurm job id."""
    return attempt_of(**{"id": 7, "executor": "slurm", "executor_id": None, "started_at": CLAIMED_AT_S,
                         "kill_requested": None, **fields})


def looked(now_s: float) -> Observation:
    """Nothing in the run dir yet; the observation's wall time is whatever the clock says."""
    return Observation(pid_record=None, exit_record=None, process_alive=False, last_progress=None,
                       last_progress_at=None, now_s=now_s)


def test_the_daemons_own_attempt_is_measured_on_its_monotonic_clock_alone() -> None:
    assert launch_age(12.0, False, CLAIMED_AT_S, CLAIMED_AT_S - 50) == LaunchAge(12.0, adopted=False)
    # the stored claim time reads an hour before the daemon's start (the clock went back since): ignored
    assert launch_age(12.0, False, CLAIMED_AT_S, CLAIMED_AT_S + HOUR_S).age_s == 12.0
    assert launch_age(-1.0, False, CLAIMED_AT_S, None).age_s == 0.0


def test_an_adopted_attempt_adds_the_stored_gap_before_this_daemon_started_when_it_is_sane() -> None:
    assert launch_age(5.0, True, CLAIMED_AT_S, CLAIMED_AT_S + 40).age_s == 45.0
    back = launch_age(5.0, True, CLAIMED_AT_S, CLAIMED_AT_S - HOUR_S)  # claimed "after" this daemon started
    assert back.age_s == 5.0 and back.distrusted is not None and "wall clock went back" in back.distrusted
    absurd = launch_age(5.0, True, CLAIMED_AT_S, CLAIMED_AT_S + MAX_TRUSTED_GAP_S + 1)
    assert (
        absurd.age_s == 5.0
        and absurd.distrusted is not None
        and "only this daemon's own measure" in absurd.distrusted
    )
    unknown = launch_age(5.0, True, CLAIMED_AT_S, None)
    assert unknown.age_s == 5.0 and unknown.distrusted is not None
    assert "only this daemon's own measure counts" in back.said() and back.said().startswith("5s since its claim")


def test_a_wall_clock_step_neither_ends_a_launch_early_nor_keeps_a_lost_one_waiting() -> None:
    clock = FakeClock(start_s=CLAIMED_AT_S + 1)
    silences = Silences(clock.monotonic_s)
    attempt = unanswered()

    def end() -> str | ClusterEnd | None:
        obs = looked(clock.now_s())
        silences.silent_s(attempt.id, obs)  # every pass looks at the attempt
        age = launch_age(silences.watched_s(attempt.id), False, attempt.started_at, CLAIMED_AT_S - 10)
        return remote_end(attempt, obs, None, True, age)

    assert end() is None  # first looked at the pass after its claim
    clock.step_wall(+HOUR_S)  # NTP, `date -s`, a VM resume: the wall clock says an hour went by
    clock.advance(10)
    assert end() is None  # 10 s of the grace gone, not an hour: its job may still appear in the queue
    clock.step_wall(-2 * HOUR_S)  # and back, past the claim: wall time says the launch is in the future
    clock.advance(LAUNCH_GRACE_S - 10 + 1)
    lost = end()
    assert isinstance(lost, ClusterEnd) and lost.outcome is AttemptOutcome.LOST and not lost.counted
    assert lost.reason == ("sbatch did not answer and no job of its name is in Slurm's queue "
                           "(1m01s watched by this daemon)")


def test_only_an_answered_poll_past_the_grace_gives_a_launch_up() -> None:
    attempt = unanswered()
    late = LaunchAge(LAUNCH_GRACE_S + 1, adopted=False)
    assert remote_end(attempt, looked(CLAIMED_AT_S), None, False, late) is None  # the queue was not asked
    assert remote_end(attempt, looked(CLAIMED_AT_S), None, True, None) is None  # no measure: nothing given up
    assert remote_end(attempt, looked(CLAIMED_AT_S), None, True, LaunchAge(LAUNCH_GRACE_S, adopted=False)) is None
    assert isinstance(remote_end(attempt, looked(CLAIMED_AT_S), None, True, late), ClusterEnd)


def test_a_claim_is_taken_for_a_dead_daemons_by_its_id_not_its_time() -> None:
    never_submitted = unanswered(executor=None)
    own = LaunchAge(0.0, adopted=False)
    adopted = LaunchAge(0.0, adopted=True)
    # an hour "before" this daemon started by the wall clock, but claimed by it: left to its launch
    assert remote_end(never_submitted, looked(CLAIMED_AT_S - HOUR_S), None, True, own) is None
    end = remote_end(never_submitted, looked(CLAIMED_AT_S), None, True, adopted)
    assert end == ClusterEnd(
        AttemptOutcome.LOST, "claimed by a daemon that stopped before submitting it", counted=False
    )


def test_the_watch_runs_on_the_monotonic_clock_and_ends_with_the_attempt() -> None:
    clock = FakeClock()
    silences = Silences(clock.monotonic_s)
    assert silences.watched_s(1) == 0.0  # not looked at yet
    silences.silent_s(1, looked(clock.now_s()))
    clock.step_wall(-HOUR_S)
    clock.advance(30)
    silences.silent_s(1, looked(clock.now_s()))
    assert silences.watched_s(1) == 30.0
    silences.keep_only([])
    assert silences.watched_s(1) == 0.0


def test_attempt_ids_only_grow_so_the_last_one_at_start_marks_the_adopted(db_path: Path) -> None:
    with Store(db_path) as store:
        assert last_attempt_id(store) == 0
        suite = load_suite("demo", PLANS)
        submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:a 2:a"), {}, None, 0), allowed_gpus=None,
                    priority=0, force=False, dry_run=False)
        ids = []
        for job_id in (1, 2):
            plan = declared_plan(job_id)
            ids.append(start_attempt(store, plan, lambda n, j=job_id: db_path.parent / f"run-{j}-{n}").id)
        assert last_attempt_id(store) == max(ids) and ids == sorted(ids)


class EmptyQueue(AnsweredCluster):
    """Slurm answers, and no job of the attempt's name is in its queue."""

    def observe(self, attempts: Sequence[tuple[Attempt, Job]]) -> dict[int, RemoteStatus]:
        return {}


def test_the_daemon_gives_up_an_unanswered_submission_by_its_own_clock_and_bars_a_late_start(
    db_path: Path, tmp_path: Path,
) -> None:
    plans = write_suite(tmp_path / "plans", "s", max_attempts=1)
    with Store(db_path) as store:
        (job,) = submit(store, plans, "s", 1)
        attempt = _start(store, job, tmp_path)
        update_attempt(store, attempt.id, executor="slurm")  # sbatch timed out: no Slurm job id
        watcher = _watcher(store, EmptyQueue(), tmp_path)
        clock = watcher.clock
        assert isinstance(clock, FakeClock)
        watcher.started_at_s, watcher.adopted_up_to_id = clock.now_s(), attempt.id - 1  # claimed by this daemon
        assert watcher.reconcile(()) == 1
        clock.step_wall(+HOUR_S)
        clock.advance(LAUNCH_GRACE_S - 1)
        assert watcher.reconcile(()) == 1  # an hour by the wall clock, within the grace by the daemon's
        clock.step_wall(-2 * HOUR_S)
        clock.advance(2)
        assert watcher.reconcile(()) == 0
        (closed,) = get_attempts(store, job.id)
        assert closed.outcome is AttemptOutcome.LOST and "sbatch did not answer" in (closed.reason or "")
        assert "watched by this daemon" in (closed.reason or "")
        assert get_job(store, job.id).state.value == "queued"  # a launch that never happened is not counted
        # a batch job that reaches a node after all finds the run dir barred: its worker never starts
        assert (Path(closed.run_dir) / RunDir.LOST_MARKER).exists()
