"""Memory learned from a running attempt, end to end: CLI, daemon, tmux, SQLite, sim GPUs."""

from __future__ import annotations

import pytest
from e2e_helpers import Orch, requires_tmux, wait_until

from orchestrator.store.queries import get_job

pytestmark = [requires_tmux, pytest.mark.tmux]


SIM_GPUS = "1x24GiB"  # the simulated cards of the `orch` fixture (tests/conftest.py)


@pytest.mark.slow
def test_second_job_starts_at_the_running_peak_while_the_first_runs(orch: Orch) -> None:
    # Declared 20 GiB, true peak 5 GiB: by the declared figure only one job fits the card. Once
    # the first has run K steps, its peak so far sizes the second, which starts beside it. The
    # second differs in learning rate, seed and run time: none of them is a memory key.
    orch.write_suite("wide", {"w": {"sim_mem_gib": 5, "sim_seconds": 12, "sim_ramp_s": 0.5,
                                    "learning_rate": 0.001}}, mem_gib=20)
    orch.submit("wide", "1:glue_rte", "--gpu-plan", "3")
    orch.start_daemon()
    wait_until(lambda: orch.attempts(1), 20, "the first job to start")
    orch.submit("wide", "2:glue_rte", "--set", "learning_rate=0.002", "--set", "sim_seconds=11")
    second = wait_until(lambda: orch.attempts(2), 30, "the second job to start")[0]
    first = orch.attempts(1)[0]
    assert first["prediction_source"] == "declared"
    assert second["prediction_source"].startswith("measured: running, step "), second["prediction_source"]
    assert first["outcome"] is None, "the second job started only after the first ended"
    # 5 GiB held, +15 % margin at step K: far below the declared 20 GiB
    assert 5 * 1024 <= second["predicted_peak_mib"] <= int(5 * 1024 * 1.16)
    shown = orch.json("memory", "--json")["shapes"]
    assert len(shown) == 1 and shown[0]["running"]["step"] >= 10 and shown[0]["peak_mib"] is None
    # nothing learned yet, but named after the live attempt's suite and config
    assert shown[0]["suite"] == "wide" and shown[0]["label"] == "w L0 glue_rte", shown[0]
    assert orch.wait_all_done(60) == {1: "succeeded", 2: "succeeded"}
    learned = orch.json("memory", "--json")["shapes"]
    assert len(learned) == 1 and learned[0]["samples"] == 2 and learned[0]["source"].startswith("measured")
    assert learned[0]["suite"] == "wide"
    # samples/s learned alone and beside the second job (4 samples per 0.25 s step: 16/s)
    (curve,) = learned[0]["throughput"].values()
    assert {"1", "2"} <= set(curve["samples_per_s"]), curve
    assert all(8 <= rate <= 24 for rate in curve["samples_per_s"].values()), curve
    # a count enters the curve once its readings cover 20 optimizer steps (a noisy start is no curve)
    counted = {k for k, n in curve["steps"].items() if n >= 20}
    assert set(curve["relative"]) == (counted if "1" in counted else set()), curve
    if "1" in counted:
        assert curve["relative"]["1"] == 1.0
        assert "GPU 0 1:1.0x" in orch.run("memory").stdout
    orch.run("memory", "forget", "--suite", "wide")
    assert orch.json("memory", "--json")["shapes"] == []


@pytest.mark.slow
def test_an_under_declared_shape_waits_for_its_probe_and_never_starts_at_the_declared_figure(orch: Orch) -> None:
    # Declared 2 GiB, true peak 9 GiB over a slow ramp. While its family has measured nothing,
    # the next job of the shape does not stack beside the first (probe before stacking): it
    # waits, saying why, and starts at what the first measured, never at the declared 2 GiB.
    orch.write_suite("tight", {"t": {"sim_mem_gib": 9, "sim_seconds": 1, "sim_ramp_s": 8}}, mem_gib=2)
    orch.submit("tight", "1:glue_rte", "--gpu-plan", "3")
    orch.start_daemon()
    wait_until(lambda: (orch.attempts(1) or [{}])[0].get("peak_mib", 0) >= 4096, 30,
               "the first attempt to hold twice its declared memory")
    orch.submit("tight", "2:glue_rte")
    reason = wait_until(lambda: orch.read(lambda store: get_job(store, 2).wait_reason), 30,
                        "the second job's waiting reason")
    assert "same memory family is measuring its peak" in reason, reason
    second = wait_until(lambda: orch.attempts(2), 60, "the second job to start")[0]
    first = orch.attempts(1)[0]
    assert first["prediction_source"] == "declared"
    assert first["ended_at"] is not None and first["ended_at"] <= second["started_at"]
    assert second["prediction_source"] == "measured", second["prediction_source"]
    assert second["predicted_peak_mib"] >= 9 * 1024, second["predicted_peak_mib"]
    assert orch.wait_all_done(60) == {1: "succeeded", 2: "succeeded"}
