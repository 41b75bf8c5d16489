"""`orch submit` of a suite that runs the user's own script: placeholders and worker settings are
checked before anything is written (exit 2, one line, no state.db or an unchanged one)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.store import Store
from orchestrator.store.rows import Job
from tests.conftest import OrchRunner
from tests.store_reads import read_jobs

CONFIG = {"batch_size": 32, "gradient_accumulation_steps": 1, "learning_rate": 0.001}
FLAGS = "python train.py --batch-size {cfg.batch_size} --grad-accum {cfg.gradient_accumulation_steps}"


def write_plans(root: Path, suite: dict[str, Any], configs: dict[str, dict[str, Any]] | None = None) -> Path:
    plans = root / "plans"
    (plans / "suites").mkdir(parents=True, exist_ok=True)
    configs = configs or {"c1": CONFIG}
    (plans / "configs" / "own").mkdir(parents=True, exist_ok=True)
    for name, content in configs.items():
        (plans / "configs" / "own" / f"{name}.yaml").write_text(yaml.safe_dump(content))
    body = {"worker": FLAGS, "mem_gib": 4, **suite, "configs": list(configs)}
    (plans / "suites" / "own.yaml").write_text(yaml.safe_dump(body))
    return plans


def submit(orch_cli: OrchRunner, plans: Path, *extra: str) -> Any:
    return orch_cli("submit", "--suite", "own", "--pairs", "1:toy", "--plans", str(plans), *extra)


def _jobs(db_path: Path) -> list[Job]:
    with Store(db_path, create=False) as store:
        return read_jobs(store)


@pytest.mark.parametrize(
    ("suite", "needle"),
    [
        ({"worker": "python train.py --batch-size {batch_size}"}, "unknown placeholder {batch_size}"),
        ({"worker": "python train.py --x {cfg.bogus}"}, "{cfg.bogus}: config c1 has no value for 'bogus'"),
        ({"worker": "python train.py {cfg.fp16?--fp16}"}, "no config of the suite has 'fp16'"),
        ({"worker": "python train.py {cfg.batch_size"}, "lone '{'"),
        ({"keys": {"batch": "bs"}}, "unknown knob 'batch'"),
        ({"progress_regex": "step (\\d+)"}, "needs a named group (?P<step>"),
        ({"result_regex": "acc ([0-9.]+"}, "not a valid regular expression"),
        ({"hang_timeout_s": "never"}, "hang_timeout_s"),
        ({"hang_timeout_s": -1}, "hang_timeout_s"),
    ],
)
def test_refused_before_anything_is_written(orch_cli: OrchRunner, tmp_path: Path, db_path: Path,
                                            suite: dict[str, Any], needle: str) -> None:
    plans = write_plans(tmp_path, suite)
    result = submit(orch_cli, plans)
    assert result.rc == 2, result
    assert needle in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not db_path.exists()


def test_refused_with_an_existing_database_leaves_it_unchanged(
    orch_cli: OrchRunner, tmp_path: Path, db_path: Path
) -> None:
    plans = write_plans(tmp_path, {})
    assert submit(orch_cli, plans).rc == 0
    before = db_path.read_bytes()
    plans = write_plans(tmp_path, {"worker": FLAGS + " --warmup {cfg.warmup_steps}"})
    result = submit(orch_cli, plans, "--force")
    assert result.rc == 2 and "warmup_steps" in result.stderr
    assert db_path.read_bytes() == before
    # --set gives the key a value: accepted
    assert submit(orch_cli, plans, "--force", "--set", "warmup_steps=10").rc == 0


def test_flag_key_the_ladder_sets_is_accepted_and_settings_are_stored(
    orch_cli: OrchRunner, tmp_path: Path, db_path: Path
) -> None:
    plans = write_plans(tmp_path, {
        "worker": FLAGS + " {cfg.gradient_checkpointing?--gradient-checkpointing}",
        "hang_timeout_s": "off",
        "progress_regex": r"it (?P<step>\d+)",
        "result_regex": r"acc (?P<accuracy>[0-9.]+)",
        "keys": {"checkpointing": "gradient_checkpointing"},
    })
    result = submit(orch_cli, plans)
    assert result.rc == 0, result.stderr
    (job,) = _jobs(db_path)
    assert job.hang_timeout_s == 0  # off
    assert job.worker_output == {"progress_regex": r"it (?P<step>\d+)", "result_regex": r"acc (?P<accuracy>[0-9.]+)"}


def test_keys_mapping_is_stored(orch_cli: OrchRunner, tmp_path: Path, db_path: Path) -> None:
    configs = {"hf": {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}}
    plans = write_plans(tmp_path, {"worker": "python train.py {config}",
                                   "keys": {"batch_size": "per_device_train_batch_size"}}, configs)
    assert submit(orch_cli, plans).rc == 0
    (job,) = _jobs(db_path)
    assert job.worker_output == {"keys": {"batch_size": "per_device_train_batch_size"}}


def test_submit_names_the_changes_the_command_cannot_receive(orch_cli: OrchRunner, tmp_path: Path) -> None:
    plans = write_plans(tmp_path, {"one_token_tasks": ["glue*"]})
    result = orch_cli("submit", "--suite", "own", "--pairs", "1:glue_rte", "--plans", str(plans))
    assert result.rc == 0
    note = result.stderr.strip()
    assert note.startswith("note: the worker command cannot receive gradient_checkpointing (rung checkpointing)")
    assert "logits_to_keep" in note and "num_data_workers (rung data_workers)" in note
    assert "batch_size" not in note  # halving reaches it: both flags are in the command
    # the advice works as given: a switch is wired by its flag-presence form
    advice = re.search(r"add e\.g\. (\S+) to the command", note)
    assert advice is not None and advice.group(1) == "{cfg.gradient_checkpointing?--gradient-checkpointing}"
    followed = write_plans(tmp_path, {"one_token_tasks": ["glue*"], "worker": f"{FLAGS} {advice.group(1)}"})
    result = orch_cli("submit", "--suite", "own", "--pairs", "2:glue_rte", "--plans", str(followed))
    assert result.rc == 0 and "gradient_checkpointing" not in result.stderr
    wired = write_plans(tmp_path, {"worker": "python train.py --cfg {config}"})
    assert orch_cli("submit", "--suite", "own", "--pairs", "1:toy", "--plans", str(wired)).stderr == ""


def test_ladder_set_of_a_renamed_batch_key_is_refused(orch_cli: OrchRunner, tmp_path: Path, db_path: Path) -> None:
    configs = {"hf": {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}}
    plans = write_plans(
        tmp_path,
        {
            "worker": "python train.py {config}",
            "keys": {"batch_size": "per_device_train_batch_size"},
            "ladder": [{"set": {"per_device_train_batch_size": 2}}],
        },
        configs,
    )
    result = submit(orch_cli, plans)
    assert result.rc == 2 and "use halve_batch" in result.stderr and not db_path.exists()
