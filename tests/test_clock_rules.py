"""Rules decided by time, reached by moving the daemon's clock instead of waiting for it: the
hang timeout, the kill grace, the head-of-line hold (starvation), the crash-loop window and the
Slurm poll backoff. The daemon, state.db, the sim GPUs and the workers are real; only the clock
is the test's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from clock_daemon import HOLD, big_job_waiting, clock_daemon
from e2e_helpers import group_alive
from hostile_helpers import hostile_command
from rows_helpers import attempt_of, job_of

from orchestrator.attempts.kills import KILL_GRACE_S
from orchestrator.attempts.reconcile import PROGRESS_REFRESH_S
from orchestrator.clock import FakeClock
from orchestrator.executors.slurm import executor as slurm
from orchestrator.store.queries import get_job
from orchestrator.store.status import paused_suites


def test_a_hung_worker_ignoring_sigterm_is_killed_after_the_grace_retried_once_then_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A ten-minute hang timeout and a 5 s grace, passed in well under a minute of real time.
    with clock_daemon(tmp_path, monkeypatch) as d:
        d.orch.write_suite("h", {"h": {**HOLD, "ignore_term": True}}, worker=hostile_command(),
                           mem_gib=0.25, hang_timeout_s=600, max_attempts=4)
        d.submit("h", "1:a")
        for n in (1, 2):
            attempt = d.tick_until(lambda n=n: (a := d.running(1)) and a.n == n and a, what=f"attempt {n} running")
            log = Path(attempt.run_dir) / "stdout.log"
            d.tick_until(lambda log=log: "hostile worker: did" in log.read_text(), what="the worker to ignore SIGTERM")
            d.clock.advance(PROGRESS_REFRESH_S)  # the daemon reads the run dir again: silence is counted from here
            d.ticks(2)
            d.clock.advance(590)
            d.ticks(2)
            assert d.attempt(1).kill_requested is None  # silent 590 s of 600: alive
            d.clock.advance(60)
            d.tick_until(lambda: d.attempt(1).kill_requested == "hung", what="the hang to be seen")
            pgid = int(str(attempt.pgid))
            # SIGTERM is ignored, and no SIGKILL comes before the grace is over on the clock
            d.tick_while(lambda pgid=pgid: group_alive(pgid) and d.attempt(1).outcome is None, real_s=1.0)
            d.clock.advance(KILL_GRACE_S)
            d.tick_until(lambda n=n: d.orch.attempt_rows(1)[n - 1].outcome is not None, what=f"attempt {n} to end")
            assert not group_alive(pgid)
        assert d.orch.job_states() == {1: "failed"}
        assert [(a.outcome, a.reason) for a in d.orch.attempt_rows(1)] == [("failed", "hung"), ("failed", "hung")]


def test_a_worker_making_output_is_never_hung(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with clock_daemon(tmp_path, monkeypatch) as d:
        d.orch.write_suite("h", {"h": HOLD}, worker=hostile_command(), mem_gib=0.25, hang_timeout_s=60)
        d.submit("h", "1:a")
        attempt = d.tick_until(lambda: d.running(1), what="the attempt running")
        log = Path(attempt.run_dir) / "stdout.log"
        for _ in range(5):  # 50 s a step, output at each: never 60 s silent
            d.clock.advance(50)
            with log.open("a") as out:
                out.write("step\n")
            stamp = d.clock.now_s()
            os.utime(log, (stamp, stamp))  # output written now, on the test's clock
            d.ticks(1)
        assert d.attempt(1).kill_requested is None
        d.clock.advance(61)
        d.tick_until(lambda: d.attempt(1).kill_requested == "hung", what="the hang to be seen")


def test_the_head_job_gets_its_card_held_once_it_waited_the_starvation_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with clock_daemon(tmp_path, monkeypatch, gpus="1x32GiB", starvation_s=600) as d:
        big_job_waiting(d)
        d.clock.advance(601)
        d.submit("third", "1:c")  # job 4 fits too, but the card is now kept for job 2
        d.ticks(3)
        states = d.orch.job_states()
        assert states == {1: "running", 2: "queued", 3: "running", 4: "queued"}
        assert len(d.orch.attempt_rows()) == 2
        reason = d.orch.read(lambda store: get_job(store, 4).wait_reason)
        assert "kept free for job 2" in reason, reason


def test_fast_failures_pause_the_suite_only_inside_the_crash_loop_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with clock_daemon(tmp_path, monkeypatch) as d:
        failing = {"corrupt": "none", "hold_s": 0, "exit_code": 1}
        d.orch.write_suite("crashy", {"crashy": failing}, worker=hostile_command(), mem_gib=0.25, max_attempts=1,
                           crash_loop={"failures": 2, "within_s": 30, "window_s": 120})
        paused = lambda: [p for p in d.orch.read(paused_suites) if p.suite == "crashy"]  # noqa: E731

        def fail(seed: str, job_id: int) -> None:
            d.submit("crashy", f"1:{seed}")
            d.tick_until(lambda: d.orch.job_states().get(job_id) == "failed", what=f"job {job_id} to fail")

        fail("a", 1)
        d.clock.advance(121)  # the first failure leaves the window
        fail("b", 2)
        assert not paused()
        d.clock.advance(60)  # both inside the window now
        fail("c", 3)
        assert paused() and "2 attempts failed within 30 s each in the last 2 min" in paused()[0].reason


def test_slurm_polls_back_off_on_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []
    answers = {"squeue": 1}

    def run(*argv: str, timeout_s: float = 0.0) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, answers["squeue"], "", "slurm_load_jobs error")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(slurm, "_run", run)
    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/usr/bin/{name}")
    clock = FakeClock()
    executor = slurm.SlurmExecutor(slurm.SlurmOptions(), clock=clock)
    live = [(attempt_of(id=1, job_id=1, n=1, executor="slurm", executor_id="42"), job_of(id=1, suite="s"))]
    squeues = lambda: sum(1 for c in calls if c[0] == "squeue")  # noqa: E731
    for failures, delay_s in ((1, 2.0), (2, 4.0), (3, 8.0)):
        assert executor.observe(live) is None and squeues() == failures
        assert executor.observe(live) is None and squeues() == failures  # backing off: not asked
        clock.advance(delay_s - 0.5)
        assert executor.observe(live) is None and squeues() == failures
        clock.advance(0.5)
    answers["squeue"] = 0
    assert executor.observe(live) is not None and squeues() == 4  # answered
    assert executor.observe(live) is not None and squeues() == 4  # the last answer stands until the period is over
    clock.advance(slurm.POLL_S)
    assert executor.observe(live) is not None and squeues() == 5
