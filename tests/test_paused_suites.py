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
                                                ("crashy", JobState.FAILED), ("fine", JobState.QUEUED)], start=1)]
    with Store(tmp_path / "state.db") as store:
        write_history(store, jobs, [], [], [], gpus=[], heartbeat_at=1.0)
        assert paused_suites(store) == []
        assert pause_suite(store, "crashy", "3 failures within 30 s", "paused crashy")
        (counted,) = paused_suites(store)
        assert (counted.suite, counted.reason, counted.queued) == ("crashy", "3 failures within 30 s", 2)
        assert paused_suites(store, count_queued=False) == [
            PausedSuite("crashy", "3 failures within 30 s", counted.paused_at, None)
        ]


def test_waiting_jobs_are_grouped_by_reason_outside_paused_suites_and_configs(tmp_path: Path) -> None:
    from orchestrator.store.endings import pause_config
    from orchestrator.store.status import WaitingGroup, waiting_groups

    specs = [("s", "a")] * 4 + [("s", "b")] * 3 + [("held", "a")] * 2 + [("s", "c")] * 2
    jobs = [PastJob(i, f"id{i}", suite, config, f"{config}.yaml", i, "rte", "sim", 1024, JobState.QUEUED, 1.0,
                    max_attempts=3, hang_timeout_s=60.0)
            for i, (suite, config) in enumerate(specs, start=1)]
    with Store(tmp_path / "state.db") as store:
        write_history(store, jobs, [], [], [], gpus=[], heartbeat_at=1.0)
        with store.write():
            store.execute("UPDATE jobs SET wait_reason = 'all allowed GPUs at their plan cap' WHERE config_name != 'b'")
            store.execute("UPDATE jobs SET wait_reason = 'GPU 0: 1.0 GiB free' WHERE config_name = 'b'")
        assert pause_suite(store, "held", "3 failures", "paused held")
        assert pause_config(store, "s", "c", "3 failures", "paused c of s")
        assert waiting_groups(store, 8) == [WaitingGroup("all allowed GPUs at their plan cap", 4, 1, 4),
                                            WaitingGroup("GPU 0: 1.0 GiB free", 3, 5, 7)]
        # the head of the queue only: its first 5 jobs
        assert waiting_groups(store, 8, head=5) == [WaitingGroup("all allowed GPUs at their plan cap", 4, 1, 4),
                                                    WaitingGroup("GPU 0: 1.0 GiB free", 1, 5, 5)]
        assert waiting_groups(store, 1) == [WaitingGroup("all allowed GPUs at their plan cap", 4, 1, 4)]
