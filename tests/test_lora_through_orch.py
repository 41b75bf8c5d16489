"""The LoRA worker through the real daemon: a `worker: lora` suite on simulated GPUs.

Real daemon, tmux, SQLite and `workers.lora` training tiny-llama on CPU; only the GPUs are
simulated. Two seeds of one config and one seed of another: all succeed, each result.json has
test metrics, `orch results` aggregates over the seeds, the longest prompt the first run
reported lowers the memory estimate of the other config, and (`share_base: sequential`, the
default) one warm process trained all three.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.prediction.memory import estimate_peak_mib, model_info_from_hf_config
from tests.e2e_helpers import Orch, requires_tmux, wait_until

pytest.importorskip("torch")  # the train extra; without it the module is skipped, not an error
pytest.importorskip("transformers")
pytest.importorskip("peft")
from workers.lora.model import save_tiny_llama

REPO = Path(__file__).resolve().parents[1]
pytestmark = requires_tmux


SIM_GPUS = "1x24GiB"  # the simulated cards of the `orch` fixture (tests/conftest.py)


def test_lora_suite_runs_through_the_daemon(orch: Orch, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    subprocess.run([sys.executable, "-m", "workers.lora.sample_data", "--out", str(data_dir),
                    "--tasks", "rte", "--n-train", "40", "--n-dev", "16"],
                   check=True, cwd=REPO, capture_output=True)  # fmt: skip
    peft = {
        "r": 4,
        "lora_alpha": 8,
        "target_modules": ["attn.q_proj", "attn.v_proj", "attn.g_proj"],
    }
    # A local model directory (config.json), so that orch can estimate the jobs' memory.
    model_dir = save_tiny_llama(tmp_path / "tiny-llama")
    config = {"model": str(model_dir), "peft": peft, "data_dir": str(data_dir), "max_steps": 3,
              "num_data_workers": 0, "prec": "fp32", "max_seq_len": 64}  # fmt: skip
    python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {"ORCH_WORKER_DEVICE": "cpu", "PYTHONPATH": python_path}
    wider = {**config, "peft": {**peft, "r": 8, "lora_alpha": 16}}
    orch.write_suite("loratiny", {"qv_r4": config, "qv_r8": wider}, worker="lora", mem_gib=2,
                     one_token_tasks=["glue*"], env=env, rounds={"r4": ["qv_r4"], "r8": ["qv_r8"]})  # fmt: skip
    # One slot on one card: the jobs run one after another, qv_r4 seed 1 first.
    orch.submit("loratiny", "1:glue-tvt_rte,2:glue-tvt_rte", "--round", "r4")
    orch.submit("loratiny", "1:glue-tvt_rte", "--round", "r8")
    orch.start_daemon()
    states = orch.wait_all_done(deadline_s=120)
    orch.stop_daemon()

    assert sorted(states.values()) == ["succeeded"] * 3, orch.attempts()
    seeds = set()
    by_config: dict[str, list[dict[str, Any]]] = {}
    for job_id in states:
        job = orch.json("show", str(job_id))
        assert [a["outcome"] for a in job["attempts"]] == ["succeeded"], job["attempts"]
        (attempt,) = job["attempts"]
        result = json.loads((Path(attempt["run_dir"]) / "result.json").read_text())
        assert result["status"] == "succeeded" and result["steps"] == 3
        assert 0.0 <= result["metrics"]["test"]["accuracy"] <= 1.0
        by_config.setdefault(job["config"], []).append({**attempt, "job": job_id, "result": result})
        if job["config"] == "qv_r4":
            seeds.add(job["seed"])
    assert seeds == {1, 2}

    # The first job was estimated at max_seq_len; it reported its longest prompt, and the other
    # config on the same model and data was then estimated at that length.
    first, second = sorted(by_config["qv_r4"], key=lambda a: a["started_at"])
    (other,) = by_config["qv_r8"]
    longest = first["result"]["longest_tokens"]
    assert isinstance(longest, int) and 0 < longest < 64
    assert first["prediction_source"] == "estimate"
    assert second["prediction_source"] == "measured"  # same shape, other seed
    assert other["started_at"] > first["ended_at"]
    assert other["prediction_source"] == f"estimate at {longest} tokens"
    info = model_info_from_hf_config(json.loads((model_dir / "config.json").read_text()))
    wider_at_longest = {**wider, "batch_size": 4, "max_seq_len": longest}  # the suite's batch
    assert other["predicted_peak_mib"] == estimate_peak_mib(wider_at_longest, info)

    # share_base: sequential, the default of `worker: lora`: the first job started a warm
    # process in a tmux window of its own, and the other two were trained in it
    ordered = sorted((a for runs in by_config.values() for a in runs),
                     key=lambda a: a["started_at"])  # fmt: skip
    logs = [(Path(a["run_dir"]) / "stdout.log").read_text() for a in ordered]
    assert all("training in warm LoRA worker process" in log for log in logs), logs[0][-2000:]
    assert "(started for this job)" in logs[0]
    assert not any("(started for this job)" in log for log in logs[1:])
    assert all(a["result"]["share_base"] == "sequential" for a in ordered)

    (row,) = [r for r in orch.json("results") if r["metric"] == "accuracy" and r["config"] == "qv_r4"]
    assert (row["suite"], row["config"], row["task"]) == ("loratiny", "qv_r4", "glue-tvt_rte")
    assert row["n_seeds"] == 2 and sorted(row["seeds"]) == [1, 2]
    assert 0.0 <= row["mean"] <= 1.0 and row["std"] >= 0.0


def test_a_cancel_stops_only_its_job_and_the_warm_process_trains_the_next(
    orch: Orch, tmp_path: Path
) -> None:
    """`orch cancel` reaches the client's window (the wrapper forwards SIGTERM), the warm process
    stops that job, and the next job of the base is trained in the same process."""
    data_dir = tmp_path / "data"
    subprocess.run([sys.executable, "-m", "workers.lora.sample_data", "--out", str(data_dir),
                    "--tasks", "rte", "--n-train", "40", "--n-dev", "16"],
                   check=True, cwd=REPO, capture_output=True)  # fmt: skip
    config = {"model": "tiny-llama", "peft": {"r": 4, "lora_alpha": 8}, "data_dir": str(data_dir),
              "max_steps": 100000, "prec": "fp32", "max_seq_len": 64,
              "checkpoint_every_steps": 0}  # fmt: skip
    python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {"ORCH_WORKER_DEVICE": "cpu", "PYTHONPATH": python_path}
    orch.write_suite("warm", {"long": config, "short": {**config, "max_steps": 3}}, worker="lora",
                     mem_gib=2, env=env, rounds={"long": ["long"], "short": ["short"]})  # fmt: skip
    orch.submit("warm", "1:glue-tvt_rte", "--round", "long")
    orch.start_daemon()

    def long_job_training() -> bool:
        rows = orch.attempts(1)
        progress = Path(rows[0]["run_dir"]) / "progress.jsonl" if rows else None
        return bool(progress and progress.exists() and progress.read_text().count("\n") >= 3)

    wait_until(long_job_training, 120, "the long job's third step")
    orch.run("cancel", "1")
    wait_until(lambda: orch.job_states().get(1) == "cancelled", 60, "job 1 to be cancelled")
    orch.submit("warm", "1:glue-tvt_rte", "--round", "short")
    states = orch.wait_all_done(deadline_s=120)
    orch.stop_daemon()
    assert states == {1: "cancelled", 2: "succeeded"}, orch.attempts()
    (first,) = orch.attempts(1)
    (second,) = orch.attempts(2)
    assert not (Path(first["run_dir"]) / "result.json").exists()  # stopped, not finished
    log = (Path(second["run_dir"]) / "stdout.log").read_text()
    assert "training in warm LoRA worker process" in log and "(started for this job)" not in log
