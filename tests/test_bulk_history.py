"""A history written in bulk reads back through the views' own readers."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import StoreError
from orchestrator.lifecycle import AttemptOutcome, JobState
from orchestrator.store.bulk_history import PastAttempt, PastEvent, PastJob, write_history
from orchestrator.store.db import Store
from orchestrator.store.gpu_samples import GpuSample, gpu_sample_series
from orchestrator.store.queries import get_attempts, get_job, state_counts
from orchestrator.store.status import daemon_reading, live_attempts, recent_retries

GPU = {"index": 0, "uuid": "GPU-0", "name": "sim", "total_mib": 24576, "used_mib": 9000, "free_mib": 15576}


def _history(tmp_path: Path) -> tuple[list[PastJob], list[PastAttempt], list[PastEvent], list[GpuSample]]:
    jobs = [PastJob(1, "id1", "E1", "c1", "configs/E1/c1.yaml", 0, "rte", "sim", 8192, JobState.SUCCEEDED, 100.0,
                    max_attempts=3, hang_timeout_s=600.0),
            PastJob(2, "id2", "E1", "c1", "configs/E1/c1.yaml", 1, "rte", "sim", 8192, JobState.RUNNING, 100.0,
                    max_attempts=3, hang_timeout_s=600.0)]  # fmt: skip
    attempts = [
        PastAttempt(
            1,
            1,
            1,
            0,
            "GPU-0",
            0,
            str(tmp_path / "a1"),
            9000,
            0,
            9500,
            110.0,
            150.0,
            AttemptOutcome.OOM,
            "oom",
        ),
        PastAttempt(
            2,
            1,
            2,
            0,
            "GPU-0",
            1,
            str(tmp_path / "a2"),
            9000,
            0,
            8000,
            160.0,
            200.0,
            AttemptOutcome.SUCCEEDED,
        ),
        PastAttempt(
            3,
            2,
            1,
            0,
            "GPU-0",
            0,
            str(tmp_path / "a3"),
            9000,
            7000,
            7000,
            170.0,
            progress={"step": 3},
        ),
    ]
    events = [PastEvent(150.0, 1, 1, "end:oom", "running", "queued", "attempt 1 oom",
                        {"retry": {"from_level": 0, "to_level": 1, "why": "oom"}}),
              PastEvent(200.0, 1, 2, "end:succeeded", "running", "succeeded", "attempt 2 succeeded")]  # fmt: skip
    samples = [GpuSample(180.0, 0, "GPU-0", 24576, 9000, 7000, 15576, {2: 7000})]
    return jobs, attempts, events, samples


def test_a_bulk_history_reads_back_through_the_views(tmp_path: Path) -> None:
    jobs, attempts, events, samples = _history(tmp_path)
    with Store(tmp_path / "state.db") as store:
        write_history(store, jobs, attempts, events, samples, gpus=[GPU], heartbeat_at=300.0)
        assert state_counts(store)["succeeded"] == 1 and state_counts(store)["running"] == 1
        assert get_job(store, 1).attempt_count == 2
        assert [a.outcome for a in get_attempts(store, 1)] == [AttemptOutcome.OOM, AttemptOutcome.SUCCEEDED]
        assert [la.attempt.id for la in live_attempts(store)] == [3]
        assert live_attempts(store)[0].attempt.progress == {"step": 3}
        assert [e.retry["to_level"] for e in recent_retries(store, 10)] == [1]
        assert [s.held_by_job for s in gpu_sample_series(store)] == [{2: 7000}]
        reading = daemon_reading(store)
        assert reading is not None and reading.heartbeat_at == 300.0 and reading.gpus == [GPU]


def test_a_history_over_existing_ids_writes_nothing(tmp_path: Path) -> None:
    jobs, attempts, events, samples = _history(tmp_path)
    with Store(tmp_path / "state.db") as store:
        write_history(store, jobs, attempts, events, samples, gpus=[GPU], heartbeat_at=300.0)
        with pytest.raises(StoreError):
            write_history(store, jobs[1:], [], events, [], gpus=[], heartbeat_at=400.0)
        assert sum(state_counts(store).values()) == 2
        assert len(gpu_sample_series(store)) == 1
        reading = daemon_reading(store)
        assert reading is not None and reading.heartbeat_at == 300.0
