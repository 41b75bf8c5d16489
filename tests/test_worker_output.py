"""A worker's output as orch reads it, without tmux: liveness from stdout.log, bounded reads of
a growing log, and launch failures counted by the crash-loop guard."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from rows_helpers import attempt_of

from orchestrator.attempts import stdout_follow
from orchestrator.attempts.crash_loop import crash_loop_of
from orchestrator.attempts.outcomes import fail_before_start
from orchestrator.attempts.reconcile import Verdict, judge, observe
from orchestrator.attempts.stdout_follow import MAX_READ_BYTES, TAIL_START_BYTES, OutputFollower
from orchestrator.executors.observation import Observation
from orchestrator.store import Store
from orchestrator.store.attempts import AttemptPlan, start_attempt
from orchestrator.store.peak_source import PredictionSource, SourceKind
from tests.test_crash_loop import paused, submit, write_suite

NOW = 1_000_000.0


def observation(**fields: Any) -> Observation:
    base: dict[str, Any] = dict(pid_record={"pid": 1}, exit_record=None, process_alive=True, last_progress=None,
                                last_progress_at=None, now_s=NOW)
    return Observation(**{**base, **fields})


ATTEMPT = attempt_of(started_at=NOW - 100.0, pid=None, proc_create_time=None)


@pytest.mark.parametrize(
    ("obs", "timeout_s", "verdict"),
    [
        (observation(silent_s=100.0), 10.0, Verdict.HUNG),  # the daemon saw nothing change for 100 s
        (observation(silent_s=1.0), 10.0, Verdict.ALIVE),  # stdout.log grew a second ago
        (observation(silent_s=20.0), 10.0, Verdict.HUNG),
        # not watched yet: no verdict from file times
        (observation(silent_s=None, last_output_at=NOW - 500.0), 10.0, Verdict.ALIVE),
        (observation(silent_s=100.0), 0.0, Verdict.ALIVE),  # hang_timeout_s: off
    ],
)
def test_any_output_is_a_sign_of_life(obs: Observation, timeout_s: float, verdict: Verdict) -> None:
    assert judge(ATTEMPT, obs, timeout_s) is verdict


def test_observe_reads_the_logs_mtime(tmp_path: Path) -> None:
    (tmp_path / "stdout.log").write_text("12/100 [")
    os.utime(tmp_path / "stdout.log", (NOW - 5, NOW - 5))
    assert observe(tmp_path, NOW).last_output_at == pytest.approx(NOW - 5)
    assert observe(tmp_path / "missing", NOW).last_output_at is None


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(start, length) of every read of stdout.log the follower makes."""
    seen: list[tuple[int, int]] = []
    real = stdout_follow.read_output

    def spy(run_dir: Path, start: int, max_bytes: int) -> bytes:
        data = real(run_dir, start, max_bytes)
        seen.append((start, len(data)))
        return data

    monkeypatch.setattr(stdout_follow, "read_output", spy)
    return seen


def test_follower_reads_only_new_bytes(tmp_path: Path, reads: list[tuple[int, int]]) -> None:
    log = tmp_path / "stdout.log"
    log.write_text("loading\nstep 1/40\n")
    follower = OutputFollower()
    first = follower.progress(7, tmp_path, None)
    assert first is not None and first["step"] == 1
    with open(log, "a") as handle:
        handle.write("\r 2/40 [00:01<00:10]\rstep 3/40 loss 0.5\n")
    second = follower.progress(7, tmp_path, None)
    assert second is not None and (second["step"], second["loss"]) == (3, 0.5)
    assert reads == [(0, 18), (18, 40)]  # each byte read once
    assert follower.progress(7, tmp_path, None) == second and len(reads) == 2  # nothing new: no read


def test_follower_of_a_huge_log_reads_its_tail(tmp_path: Path, reads: list[tuple[int, int]]) -> None:
    log = tmp_path / "stdout.log"
    with open(log, "wb") as handle:
        handle.write((b"x" * 1023 + b"\n") * (8 * 1024))  # 8 MiB of noise, as if the daemon restarted
        handle.write(b"step 20/40\n")
    follower = OutputFollower()
    progress = follower.progress(1, tmp_path, None)
    assert progress is not None and progress["step"] == 20
    assert sum(length for _, length in reads) <= TAIL_START_BYTES
    with open(log, "ab") as handle:  # a burst larger than one pass may read
        handle.write(b"y" * (3 * MAX_READ_BYTES) + b"\nstep 21/40\n")
    progress = follower.progress(1, tmp_path, None)
    assert progress is not None and progress["step"] == 21
    assert reads[-1][1] <= MAX_READ_BYTES


def test_follower_refuses_a_symlinked_log(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("step 5/9\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "stdout.log").symlink_to(target)
    assert OutputFollower().progress(1, run_dir, None) is None


def test_follower_forgets_ended_attempts(tmp_path: Path) -> None:
    (tmp_path / "stdout.log").write_text("step 1/2\n")
    follower = OutputFollower()
    follower.progress(1, tmp_path, None)
    follower.progress(2, tmp_path, None)
    follower.keep_only([2])
    assert set(follower._followed) == {2}


def test_launch_failures_count_for_the_crash_loop_guard(db_path: Path, tmp_path: Path) -> None:
    plans = write_suite(tmp_path / "plans", "broken")
    with Store(db_path) as store:
        jobs = submit(store, plans, "broken", 3)
        for job in jobs:
            plan = AttemptPlan(job_id=job.id, gpu_index=0, gpu_uuid="GPU-0", level=0, level_step="as_configured",
                               changes={}, overrides={}, run_alone=False, predicted_peak_mib=1024,
                               prediction_source=PredictionSource(SourceKind.DECLARED), reserved_mib=1024)
            attempt = start_attempt(store, plan, lambda n, job=job: tmp_path / "runs" / str(job.id) / str(n))
            assert "broken" not in paused(store)
            fail_before_start(store, attempt, "could not start: unknown placeholder {batch_size}")
        assert crash_loop_of(jobs[0]).failures == 3
        assert paused(store) == {"broken": "3 attempts failed within 30 s each in the last 5 min"}


def test_our_workers_progress_is_never_read_from_stdout() -> None:
    # lora and sim write progress.jsonl; their stdout has only loading bars before it exists
    from orchestrator.attempts.stdout_follow import follows_stdout

    assert not follows_stdout("lora") and not follows_stdout("sim")
    assert follows_stdout("python train.py --cfg {config}")
