"""Plans and GPU counts that could never run are refused at submit; a new plan replaces the old."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import OrchRunner
from tests.test_cli_expectations import one_error_line

SUBMIT = ("submit", "--suite", "demo", "--pairs", "87:glue_rte")


@pytest.fixture
def two_sim_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_GPU_BACKEND", "sim")
    monkeypatch.setenv("ORCH_SIM_GPUS", "2x24GiB")


def test_a_plan_for_more_gpus_than_exist_names_those_that_do(
    orch_inproc: OrchRunner, db_path: Path, two_sim_gpus: None
) -> None:
    result = orch_inproc(*SUBMIT, "--gpu-plan", "2,1,1")
    assert result.rc == 2
    line = one_error_line(result.stderr)
    assert "'2,1,1'" in line and "GPU 2" in line and "its GPUs: 0 1" in line
    assert not db_path.exists()
    assert orch_inproc("plan", "set", "2,1,1").rc == 2


def test_a_new_plan_replaces_the_old_one_whole(
    orch_inproc: OrchRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_GPU_BACKEND", "sim")
    monkeypatch.setenv("ORCH_SIM_GPUS", "3x24GiB")
    assert orch_inproc(*SUBMIT, "--gpu-plan", "2,1,1").rc == 0
    assert orch_inproc(*SUBMIT, "--gpu-plan", "2,2").rc == 0
    assert json.loads(orch_inproc("plan", "show", "--json").stdout)["gpus"] == {"0": 2, "1": 2}
    assert "GPU 2" not in orch_inproc("plan", "show").stdout
    assert orch_inproc("plan", "set", "1", "--gpus", "2").rc == 0
    assert json.loads(orch_inproc("plan", "show", "--json").stdout)["gpus"] == {"2": 1}


def test_a_gang_with_fewer_gpus_than_it_needs_is_refused(
    orch_inproc: OrchRunner, db_path: Path, two_sim_gpus: None
) -> None:
    narrowed = orch_inproc(*SUBMIT, "--set", "gpus=2", "--gpus", "0")
    assert narrowed.rc == 2
    line = one_error_line(narrowed.stderr)
    assert "needs gpus: 2" in line and "--gpus gives it 1 GPU(s) (0)" in line
    too_many = orch_inproc(*SUBMIT, "--set", "gpus=3")
    assert too_many.rc == 2
    assert "this machine has 2 GPU(s) (0 1)" in one_error_line(too_many.stderr)
    assert not db_path.exists()
    assert orch_inproc(*SUBMIT, "--set", "gpus=2").rc == 0  # two GPUs: it fits
