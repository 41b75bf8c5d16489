"""Packing rehearsed on simulated GPUs: a worker that is not orch's simulator holds its declared
memory there (a simulated footprint), so the README tutorial stacks two jobs on a card as a GPU
box would, instead of one per card with peaks of 0.0 GiB."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from orchestrator.gpu.sim import SimProbe
from orchestrator.gpu.sim_files import sim_uuid
from orchestrator.gpu.sim_footprint import (
    FOOTPRINT_VAR,
    SimFootprint,
    footprint_cards,
    footprint_env,
)
from orchestrator.procstat import create_time_s, read_stat
from tests.e2e_helpers import REPO_ROOT, Orch, orch_env, requires_tmux, wait_until

SIM_ENV = {"ORCH_GPU_BACKEND": "sim", "ORCH_SIM_GPUS": "2x24GiB"}


def test_the_footprint_is_asked_for_any_worker_but_the_simulator_on_simulated_gpus_only() -> None:
    assert footprint_env(SIM_ENV, "python train.py --lr {cfg.lr}", 2048) == {FOOTPRINT_VAR: "2048"}
    assert footprint_env(SIM_ENV, "sim", 2048) == {}  # orch's simulator holds its own memory
    assert footprint_env({}, "python train.py", 2048) == {}  # real GPUs: real memory
    assert footprint_cards(f"{sim_uuid(1)},{sim_uuid(0)}", 2) == [1, 0]
    assert footprint_cards("1", 2) == [1] and footprint_cards("GPU-elsewhere", 2) == []


def test_a_held_footprint_is_the_workers_memory_until_released(tmp_path: Path) -> None:
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stat = read_stat(worker.pid)
        assert stat is not None
        env = {
            **SIM_ENV,
            "ORCH_SIM_DIR": str(tmp_path),
            "CUDA_VISIBLE_DEVICES": sim_uuid(1),
            FOOTPRINT_VAR: "2048",
        }
        footprint = SimFootprint(env)
        footprint.hold(worker.pid, create_time_s(stat) or 0.0)
        probe = SimProbe(tmp_path, [24 * 1024, 24 * 1024], {})
        first, second = probe.snapshot()
        assert first.used_mib == 0 and second.used_mib == 2048
        assert [(p.pid, p.used_mib) for p in second.processes] == [(worker.pid, 2048)]
        footprint.release()
        assert probe.snapshot()[1].used_mib == 0
        footprint.hold(worker.pid, create_time_s(stat) or 0.0)
        worker.kill()
        worker.wait()
        assert probe.snapshot()[1].used_mib == 0  # a worker gone holds nothing, released or not
    finally:
        worker.kill()
        worker.wait()


@requires_tmux
def test_the_readme_tutorial_stacks_two_jobs_on_a_simulated_card(tmp_path: Path) -> None:
    with orch_env(tmp_path, gpus="2x24GiB") as orch:
        shutil.copytree(
            REPO_ROOT / "examples", orch.root / "examples"
        )  # run from a checkout, as the README says
        orch.env["ORCH_PLANS"] = str(orch.root / "examples" / "tutorial" / "plans")
        orch.submit("tutorial", "1:toy 2:toy 3:toy", "--gpu-plan", "2,2")
        orch.start_daemon()

        def stacked(o: Orch = orch) -> dict[str, Any] | None:
            # two jobs on one card, each holding its declared 2 GiB (as the daemon last read it)
            gpus = o.json("status")["gpus"]
            return next((g for g in gpus if g["running"] == 2 and g["orch_mib"] >= 2 * 2048), None)

        card = wait_until(stacked, 120, "two tutorial jobs on one simulated card, 2 GiB each")
        assert card["used_mib"] == card["orch_mib"] == 2 * 2048, card
        ended = wait_until(
            lambda: [a for a in orch.attempt_rows() if a.outcome] or None,
            120,
            "a finished tutorial attempt",
        )
        peaks = [a.peak_mib for a in ended]
        assert all(2000 <= p <= 2100 for p in peaks), peaks  # measured, not 0.0 GiB
        # long enough for the README's step 4 (Watch) to show it running
        assert all((a.ended_at or 0) - a.started_at >= 10 for a in ended), ended
        orch.run("cancel", "--all")
