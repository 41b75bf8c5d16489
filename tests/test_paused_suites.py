"""Paused suites are read in one place: the views with each suite's queued count, the
daemon's pass without it (the names and reasons are all it needs)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.lifecycle import JobState
from orchestrator.store.bulk_history import PastJob, write_history
from orchestrator.store.db import Store
from orchestrator.store.endings import pause_suite
from orchestrator.store.status import PausedSuite, paused_suites


def test_the_views_count_a_paused_suites_queue_and_the_daemon_reads_it_without(tmp_path: Path) -> None:
    jobs = [PastJob(i, f"id{i}", suite, "c", "c.yaml", i, "rte", "sim", 1024, state, 1.0, max_attempts=3,
                    hang_timeout_s=60.0)
            for i, (suite, state) in enumerate([("crashy", JobState.QUEUED), ("crashy", JobState.QUEUED),
                                                ("crashy", JobState.FAILED), ("fine", JobState.QUEUED)], start=1)]  # fmt: skip
    with Store(tmp_path / "state.db") as store:
        write_history(store, jobs, [], [], [], gpus=[], heartbeat_at=1.0)
        assert paused_suites(store) == []
        assert pause_suite(store, "crashy", "3 failures within 30 s", "paused crashy")
        (counted,) = paused_suites(store)
        assert (counted.suite, counted.reason, counted.queued) == ("crashy", "3 failures within 30 s", 2)
        assert paused_suites(store, count_queued=False) == [
            PausedSuite("crashy", "3 failures within 30 s", counted.paused_at, None)
        ]
