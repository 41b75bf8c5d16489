"""Counts of a sweep's attempts by stage: an attempt is launched once its executor answered
with its own id (a tmux window, a Slurm job) or with the process it started."""

from __future__ import annotations

from pathlib import Path

from orchestrator.lifecycle import AttemptOutcome, JobState
from orchestrator.store.attempts import update_attempt
from orchestrator.store.bulk_history import PastAttempt, PastJob, write_history
from orchestrator.store.db import Store
from orchestrator.store.sweep_attempts import AttemptCounts, all_attempts, attempt_counts


def test_claimed_launched_and_live_attempts_are_counted_apart(tmp_path: Path) -> None:
    jobs = [PastJob(i, f"id{i}", "E1", "c1", "c1.yaml", i, "rte", "sim", 1024,
                    JobState.SUCCEEDED if i == 1 else JobState.RUNNING, 10.0, max_attempts=3, hang_timeout_s=60.0)
            for i in (1, 2, 3)]  # fmt: skip
    attempts = [
        PastAttempt(1, 1, 1, 0, "GPU-0", 0, str(tmp_path / "a1"), 900, 0, 800, 20.0, 30.0, AttemptOutcome.SUCCEEDED),
        PastAttempt(2, 2, 1, 0, "GPU-0", 0, str(tmp_path / "a2"), 900, 0, 0, 25.0),
        PastAttempt(3, 3, 1, 1, "GPU-1", 0, str(tmp_path / "a3"), 900, 0, 0, 21.0),
    ]
    with Store(tmp_path / "state.db") as store:
        write_history(store, jobs, attempts, [], [], gpus=[], heartbeat_at=40.0)
        assert attempt_counts(store) == AttemptCounts(claimed=3, launched=0, live=2)
        update_attempt(store, 1, executor="tmux", executor_id="@4", pid=4242)
        update_attempt(store, 2, executor="subprocess", pid=4343)  # no id of its own: its process
        assert attempt_counts(store) == AttemptCounts(claimed=3, launched=2, live=2)
        assert [a.id for a in all_attempts(store)] == [1, 2, 3]
        assert [a.executor_id for a in all_attempts(store)] == ["@4", None, None]
