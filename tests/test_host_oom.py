"""Host-RAM OOM end to end: sim workers that run out of host memory while they have data
workers are classified `host_oom` and retried with the ladder's host-side step only (fewer data
workers), GPU-side settings untouched, on the real daemon, tmux, SQLite and simulated GPUs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import Orch, orch_env, requires_tmux

pytestmark = [requires_tmux, pytest.mark.tmux, pytest.mark.slow]

DATA_WORKERS = 4  # above the sim's default sim_host_max_workers (0): every first attempt fails
GPU_SIDE_KEYS = ("batch_size", "gradient_accumulation_steps", "gradient_checkpointing")
SWEEP_DEADLINE_S = 40.0


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Orch, dict[int, str]]]:
    """One sweep for every test here: two loader-heavy jobs, one per simulated GPU."""
    with orch_env(tmp_path_factory.mktemp("host_oom")) as orch:
        orch.write_suite(
            "loader",
            {
                "loader": {
                    "sim_mem_gib": 2,
                    "sim_fail": "host_oom",
                    "num_data_workers": DATA_WORKERS,
                    "sim_seconds": 1,
                }
            },
            mem_gib=3,
        )
        orch.submit("loader", "1:glue_rte 2:glue_rte", "--gpu-plan", "1,1")
        orch.start_daemon()
        yield orch, orch.wait_all_done(SWEEP_DEADLINE_S)


def _config_yaml(attempt: dict[str, Any]) -> dict[str, Any]:
    loaded = yaml.safe_load((Path(attempt["run_dir"]) / "config.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_host_oom_is_retried_with_fewer_data_workers(sweep: tuple[Orch, dict[int, str]]) -> None:
    orch, states = sweep
    assert states == {1: "succeeded", 2: "succeeded"}, states
    for job_id in states:
        show = orch.json("show", str(job_id))
        attempts = show["attempts"]
        assert [a["outcome"] for a in attempts] == ["host_oom", "succeeded"], attempts
        first, retry = attempts
        assert "DefaultCPUAllocator" in (first["reason"] or ""), first
        # The ladder level stays; orch show lists the host-side step and nothing GPU-side.
        assert retry["level"] == first["level"] == 0
        assert retry["step"] == "data_workers"
        assert retry["changes"] == {"num_data_workers": 0}, retry
        assert retry["overrides"] == {"num_data_workers": 0}, retry
        assert not retry["run_alone"]
        retry_events = [e for e in show["events"] if e["kind"] == "end:host_oom"]
        assert len(retry_events) == 1, show["events"]
        assert "num_data_workers=0" in retry_events[0]["message"]
        starts = [e["message"] for e in show["events"] if e["kind"] == "start"]
        assert len(starts) == 2 and "(data_workers)" in starts[1], starts  # the retry names its step

        rows = orch.attempts(job_id)
        before, after = _config_yaml(rows[0]), _config_yaml(rows[1])
        assert before["num_data_workers"] == DATA_WORKERS
        assert after["num_data_workers"] < before["num_data_workers"]
        assert after["batch_size"] * after["gradient_accumulation_steps"] == (
            before["batch_size"] * before["gradient_accumulation_steps"]
        )
        assert (Path(rows[1]["run_dir"]) / "result.json").exists()


def test_host_oom_retry_keeps_the_gpu_side_settings(sweep: tuple[Orch, dict[int, str]]) -> None:
    orch, states = sweep
    for job_id in states:
        rows = orch.attempts(job_id)
        assert len(rows) == 2, rows
        before, after = _config_yaml(rows[0]), _config_yaml(rows[1])
        assert {k: after[k] for k in GPU_SIDE_KEYS} == {k: before[k] for k in GPU_SIDE_KEYS}
