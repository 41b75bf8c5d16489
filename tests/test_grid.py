"""Sweeps as grids: `--grid KEY=V1,V2` and a suite's grid:/seeds:/tasks:, values typed by the
configs' own types, and `--set` refusing a repeated key or a comma list."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import PlanError
from orchestrator.plans import expand_jobs, load_suite, parse_pairs
from orchestrator.plans.grid import combinations, parse_grid, parse_sets
from tests.conftest import OrchRunner


@pytest.fixture
def plans(tmp_path: Path) -> Path:
    root = tmp_path / "plans"
    (root / "suites").mkdir(parents=True)
    (root / "configs" / "g").mkdir(parents=True)
    for name, rank in (("r8", 8), ("r16", 16)):
        (root / "configs" / "g" / f"{name}.yaml").write_text(yaml.safe_dump(
            {"model": "tiny-llama", "learning_rate": 0.0001, "batch_size": 8, "lora_r": rank, "prec": "bf16",
             "target_modules": "q_proj,v_proj", "gradient_checkpointing": False, "sim_seconds": 1}))
    (root / "suites" / "g.yaml").write_text(yaml.safe_dump({"worker": "sim", "mem_gib": 1, "configs": ["r8", "r16"]}))
    (root / "suites" / "gs.yaml").write_text(yaml.safe_dump(
        {"worker": "sim", "mem_gib": 1, "configs": ["r8"], "config_dir": "../configs/g", "seeds": [1, 2],
         "tasks": ["glue_rte", "glue_sst2"], "grid": {"batch_size": [4, 8]}, "not_science": ["sim_seconds"]}))
    return root


def test_values_are_typed_as_the_configs_hold_them(plans: Path) -> None:
    suite = load_suite("g", plans)
    known = suite.known_keys()
    sets = parse_sets(["learning_rate=3", "batch_size=1e1", "prec=1", "target_modules=q_proj,k_proj",
                       "gradient_checkpointing=true", "env.WANDB_MODE=1e-4"], known, suite.configs)
    assert sets == {"learning_rate": 3.0, "batch_size": 10, "prec": "1", "target_modules": "q_proj,k_proj",
                    "gradient_checkpointing": True, "env.WANDB_MODE": "1e-4"}
    assert type(sets["learning_rate"]) is float and type(sets["batch_size"]) is int
    assert parse_sets(["lora_r=0.5"], known, suite.configs) == {"lora_r": 0.5}  # a fraction widens, never truncated
    grid = parse_grid(["learning_rate=1e-4,3e-4", "lora_r=4,8"], known, suite.configs)
    assert grid == {"learning_rate": [1e-4, 3e-4], "lora_r": [4, 8]}
    assert all(type(v) is float for v in grid["learning_rate"])
    assert combinations(grid)[:2] == [{"learning_rate": 1e-4, "lora_r": 4}, {"learning_rate": 1e-4, "lora_r": 8}]


@pytest.mark.parametrize(("sets", "grid", "message"), [
    (["batch_size=4", "batch_size=8"], [], "--set batch_size is given twice"),
    (["learning_rate=1e-4,3e-4"], [], "use --grid learning_rate=1e-4,3e-4"),
    (["learning_rate=fast"], [], "not a number, and learning_rate is a number in the config"),
    (["learning_rate=.inf"], [], "not a number, and learning_rate is a number in the config"),
    (["gradient_checkpointing=2"], [], "true or false"),
    ([], ["seed=1,2"], "seed and data come from --pairs"),
    ([], ["lora_r=4,4"], "value 4 is given twice"),
    ([], ["lora_r=4,"], "has an empty value"),
    (["lora_r=4"], ["lora_r=8,16"], "keep one"),
])
def test_bad_sets_and_grids_are_refused_naming_the_value(plans: Path, sets: list[str], grid: list[str],
                                                         message: str) -> None:
    suite = load_suite("g", plans)
    with pytest.raises(PlanError, match=message.replace("(", r"\(")):
        overrides = parse_sets(sets, suite.known_keys(), suite.configs)
        parse_grid(grid, suite.known_keys(), suite.configs, overrides)


def test_configs_times_grid_times_pairs_each_a_job_of_its_own(plans: Path) -> None:
    suite = load_suite("g", plans)
    grid = combinations(parse_grid(["learning_rate=1e-4,3e-4"], suite.known_keys(), suite.configs))
    jobs = expand_jobs(suite, parse_pairs("1:glue_rte 2:glue_rte"), {"batch_size": 4}, None, 0, grid)
    assert [(j.config_name, j.config["learning_rate"], j.seed) for j in jobs] == [
        ("r8", 1e-4, 1), ("r8", 1e-4, 2), ("r8", 3e-4, 1), ("r8", 3e-4, 2),
        ("r16", 1e-4, 1), ("r16", 1e-4, 2), ("r16", 3e-4, 1), ("r16", 3e-4, 2)]
    assert jobs[2].overrides == {"batch_size": 4, "learning_rate": 3e-4}
    assert len({j.identity for j in jobs}) == 8


def test_a_suite_file_carries_its_grid_seeds_tasks_and_keys_that_are_not_science(plans: Path) -> None:
    suite = load_suite("gs", plans)
    assert suite.grid == {"batch_size": [4, 8]}
    assert [str(p) for p in suite.pairs] == ["1:glue_rte", "1:glue_sst2", "2:glue_rte", "2:glue_sst2"]
    assert suite.not_science == ("sim_seconds",)
    (plans / "suites" / "bad.yaml").write_text(yaml.safe_dump({"worker": "sim", "mem_gib": 1, "configs": ["r8"],
                                                               "config_dir": "../configs/g", "tasks": ["glue_rte"]}))
    with pytest.raises(PlanError, match="`seeds` must be a non-empty list"):
        load_suite("bad", plans)


def test_submit_grid_queues_floats_and_dry_run_lists_them(orch_cli: OrchRunner, plans: Path, db_path: Path) -> None:
    shown = orch_cli("submit", "--plans", str(plans), "--suite", "g", "--pairs", "1:glue_rte",
                 "--grid", "learning_rate=1e-4,3e-4", "--dry-run")
    assert shown.rc == 0, shown.stderr
    assert "would queue 4 job(s)" in shown.stdout and "r16  seed 1  glue_rte  learning_rate=0.0003" in shown.stdout
    assert not db_path.exists()
    done = orch_cli("submit", "--plans", str(plans), "--suite", "g", "--pairs", "1:glue_rte",
                "--grid", "learning_rate=1e-4,3e-4", "--grid", "lora_r=4,8", "--json")
    assert done.rc == 0, done.stderr
    queued = json.loads(done.stdout)
    assert queued["created"] == 8 and queued["grid"] == {"learning_rate": [1e-4, 3e-4], "lora_r": [4, 8]}
    values = [job["overrides"]["learning_rate"] for job in queued["jobs"]]
    assert values == [1e-4, 1e-4, 3e-4, 3e-4] * 2 and all(isinstance(v, float) for v in values)
    suite_file = orch_cli("submit", "--plans", str(plans), "--suite", "gs", "--json")
    assert suite_file.rc == 0, suite_file.stderr
    assert json.loads(suite_file.stdout)["created"] == 8  # 2 seeds × 2 tasks × batch 4, 8


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "batch_size=4", "--set", "batch_size=8"], "--set batch_size is given twice"),
    (["--set", "learning_rate=1e-4,3e-4"], "use --grid learning_rate=1e-4,3e-4"),
    (["--grid", "nope=1,2"], "unknown config key"),
])
def test_submit_refuses_in_one_line_and_writes_nothing(orch_cli: OrchRunner, plans: Path, db_path: Path,
                                                       args: list[str], message: str) -> None:
    done = orch_cli("submit", "--plans", str(plans), "--suite", "g", "--pairs", "1:glue_rte", *args)
    assert done.rc == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr and not db_path.exists()
