"""A real `torchrun --nproc_per_node=2` job (CPU, gloo, a tiny model) through orch: `{nproc}` and
`{port}` filled per attempt, two jobs at once on their own ports, and the sharded-training ladder
(`set:` rungs: use_fsdp, then fsdp_cpu_offload) reaching the script under its own key names."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import REPO_ROOT, Orch, requires_tmux

from orchestrator.gpu.sim_files import sim_uuid

pytestmark = [requires_tmux, pytest.mark.tmux, pytest.mark.slow]

SCRIPT = REPO_ROOT / "examples" / "torchrun_tiny.py"
WORKER = (
    f"{sys.executable} -m torch.distributed.run --nproc_per_node={{nproc}} --master_addr=127.0.0.1 "
    f"--master_port={{port}} {SCRIPT} --steps 6 --step-s 0 --batch {{cfg.micro_batch}} "
    "--grad-accum {cfg.accum} --budget-mib {cfg.budget_mib} {cfg.use_fsdp?--sharded} "
    "{cfg.fsdp_cpu_offload?--cpu-offload}"
)
# DDP first; after an OOM the optimizer state is sharded (FSDP's optimizer half), then offloaded;
# only then is the batch halved, under the script's own key names (`keys:`)
SHARDED_LADDER = [
    {"name": "fsdp", "set": {"use_fsdp": True}},
    {"name": "fsdp_offload", "set": {"fsdp_cpu_offload": True}},
    {"halve_batch": True},
]


SIM_GPUS = "4x24GiB"  # the simulated cards of the `orch` fixture (tests/conftest.py)


def _write(orch: Orch, name: str, budget_mib: float) -> None:
    (orch.plans / "configs" / name).mkdir(parents=True)
    (orch.plans / "configs" / name / "ddp.yaml").write_text(yaml.safe_dump(
        {"micro_batch": 8, "accum": 1, "budget_mib": budget_mib, "gpus": 2}))
    (orch.plans / "suites" / f"{name}.yaml").write_text(yaml.safe_dump({
        "worker": WORKER, "mem_gib": 2, "configs": ["ddp"], "max_attempts": 4, "hang_timeout_s": 120,
        "keys": {"batch_size": "micro_batch", "accumulation": "accum"}, "ladder": SHARDED_LADDER,
    }))


def _result(attempt: dict[str, Any]) -> dict[str, Any]:
    lines = (Path(attempt["run_dir"]) / "stdout.log").read_text().splitlines()
    return json.loads([line for line in lines if line.startswith("{")][-1])


def test_two_torchrun_jobs_at_once_get_their_own_ports(orch: Orch) -> None:
    _write(orch, "ddp", budget_mib=0.0)
    orch.submit("ddp", "1:glue_rte 2:glue_rte", "--gpu-plan", "1")
    orch.start_daemon()
    states = orch.wait_all_done(240)
    assert set(states.values()) == {"succeeded"}, states
    first, second = orch.attempts()
    assert first["port"] != second["port"]
    # they ran at the same time, each on its own pair of cards
    assert first["started_at"] < second["ended_at"] and second["started_at"] < first["ended_at"]
    pairs = {tuple(json.loads(a["gpu_uuids_json"])) for a in (first, second)}
    assert pairs == {(sim_uuid(0), sim_uuid(1)), (sim_uuid(2), sim_uuid(3))}
    for attempt in (first, second):
        (shown,) = orch.json("show", str(attempt["job_id"]))["attempts"]
        assert shown["port"] == attempt["port"] and shown["gpu_uuids"] == json.loads(attempt["gpu_uuids_json"])
        result = _result(attempt)
        assert result["world_size"] == 2 and result["master_port"] == attempt["port"]
        assert [r["rank"] for r in result["ranks"]] == [0, 1]
        assert attempt["host_peak_mib"] > 50  # RSS of torchrun and both ranks


def test_a_ddp_oom_on_one_rank_retries_under_fsdp_then_cpu_offload(orch: Orch) -> None:
    # the tiny model's state is 4 x 0.016 MiB under DDP, 3 x sharded, 2 x offloaded
    _write(orch, "shard", budget_mib=0.04)
    orch.submit("shard", "1:glue_rte", "--gpu-plan", "1")
    orch.start_daemon()
    states = orch.wait_all_done(240)
    assert set(states.values()) == {"succeeded"}, states
    attempts = orch.attempts()
    assert [a["outcome"] for a in attempts] == ["oom", "oom", "succeeded"]
    assert [a["level_step"] for a in attempts] == ["as_configured", "fsdp", "fsdp_offload"]
    final = yaml.safe_load((Path(attempts[-1]["run_dir"]) / "config.yaml").read_text())
    assert final["use_fsdp"] is True and final["fsdp_cpu_offload"] is True and final["micro_batch"] == 8
    result = _result(attempts[-1])
    assert result["sharded"] is True and result["cpu_offload"] is True
