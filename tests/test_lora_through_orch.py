"""The LoRA worker through the real daemon: a `worker: lora` suite on simulated GPUs.

Real daemon, tmux, SQLite and `workers.lora` training tiny-llama on CPU; only the GPUs are
simulated. Two seeds of one config: both succeed, each result.json has test metrics, and
`orch results` aggregates them over the seeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e_helpers import Orch, orch_env, requires_tmux

REPO = Path(__file__).resolve().parents[1]
pytestmark = requires_tmux


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path, gpus="1x24GiB") as o:
        yield o


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
    config = {"model": "tiny-llama", "peft": peft, "data_dir": str(data_dir), "max_steps": 3,
              "num_data_workers": 0, "prec": "fp32", "max_seq_len": 64}  # fmt: skip
    python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {"ORCH_WORKER_DEVICE": "cpu", "PYTHONPATH": python_path}
    orch.write_suite("loratiny", {"qv_r4": config}, worker="lora", mem_gib=2,
                     one_token_tasks=["glue*"], env=env)  # fmt: skip
    orch.submit("loratiny", "1:glue-tvt_rte,2:glue-tvt_rte")
    orch.start_daemon()
    states = orch.wait_all_done(deadline_s=90)
    orch.stop_daemon()

    assert sorted(states.values()) == ["succeeded", "succeeded"], orch.attempts()
    seeds = set()
    for job_id in states:
        job = orch.json("show", str(job_id))
        (attempt,) = job["attempts"]
        assert attempt["outcome"] == "succeeded"
        result = json.loads((Path(attempt["run_dir"]) / "result.json").read_text())
        assert result["status"] == "succeeded" and result["steps"] == 3
        assert 0.0 <= result["metrics"]["test"]["accuracy"] <= 1.0
        seeds.add(job["seed"])
    assert seeds == {1, 2}

    (row,) = [r for r in orch.json("results") if r["metric"] == "accuracy"]
    assert (row["suite"], row["config"], row["task"]) == ("loratiny", "qv_r4", "glue-tvt_rte")
    assert row["n_seeds"] == 2 and sorted(row["seeds"]) == [1, 2]
    assert 0.0 <= row["mean"] <= 1.0 and row["std"] >= 0.0
