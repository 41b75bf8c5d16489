"""`orch submit` of a `worker: lora` suite refuses a config key the worker does not know, and a
value the worker would refuse at start (a mistyped task, a fractional batch), each with exit 2,
one line naming it and nothing written: a misspelt key must not train with a default, and a
mistake the config alone shows must not wait in the queue to fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import OrchRunner

CONFIG = {"model": "tiny-llama", "batch_size": 8, "learning_rate": 0.001, "num_epochs": 1}


def write_plans(root: Path, config: dict[str, Any], **suite: Any) -> Path:
    plans = root / "plans"
    (plans / "configs" / "tl").mkdir(parents=True)
    (plans / "suites").mkdir(parents=True)
    (plans / "configs" / "tl" / "c1.yaml").write_text(yaml.safe_dump(config))
    body = {"worker": "lora", "mem_gib": 2, "configs": ["c1"], **suite}
    (plans / "suites" / "tl.yaml").write_text(yaml.safe_dump(body))
    return plans


@pytest.mark.parametrize(
    ("config", "suite", "extra", "needle"),
    [
        (
            {**CONFIG, "warmup_step": 10},
            {},
            (),
            "config c1: unknown config key 'warmup_step' (did you mean 'warmup_steps'?) (known: ",
        ),
        (CONFIG, {}, ("--set", "weight_decy=0.1"), "'weight_decy': unknown config key (did you mean 'weight_decay'?)"),
        (
            CONFIG,
            {"ladder": [{"set": {"grad_ckpt": True}}]},
            (),
            "ladder set: unknown config key 'grad_ckpt'",
        ),
    ],
)
def test_unknown_lora_keys_are_refused_at_submit(
    orch_cli: OrchRunner, tmp_path: Path, db_path: Path, config: dict[str, Any], suite: dict[str, Any],
    extra: tuple[str, ...], needle: str,
) -> None:  # fmt: skip
    plans = write_plans(tmp_path, config, **suite)
    result = orch_cli("submit", "--suite", "tl", "--pairs", "1:glue_rte", "--plans", str(plans), *extra)
    assert result.rc == 2, result
    assert needle in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not db_path.exists()


@pytest.mark.parametrize(
    ("config", "pairs", "extra", "needle"),
    [
        (CONFIG, "1:glue-tvt_rt", (), "task glue-tvt_rt: unknown task 'rt' in 'glue-tvt_rt' (known: cola, "),
        (CONFIG, "1:rte", (), "data name 'rte' is not glue_<task>[_N] or glue-tvt_<task>[_N]"),
        (CONFIG, "1:glue_stsb", (), "task 'stsb' is a regression task"),
        (CONFIG, "1:GLUE-TVT_RTE", (), "task GLUE-TVT_RTE: write the data name as the worker reads it, glue-tvt_rte"),
        ({**CONFIG, "batch_size": 8.5}, "1:glue_rte", (), "config key 'batch_size' must be an integer, got 8.5"),
        (CONFIG, "1:glue_rte", ("--set", "learning_rate=-0.1"), "'learning_rate' must be a finite positive"),
        (CONFIG, "1:glue_rte", ("--set", "prec=fp16"), "config key 'prec' must be bf16 or fp32, got 'fp16'"),
        ({**CONFIG, "lr_scheduler": "step"}, "1:glue_rte", (), "'lr_scheduler' must be one of constant, "),
        ({**CONFIG, "gradient_checkpointing": "maybe"}, "1:glue_rte", (), "must be true or false, got 'maybe'"),
        ({"batch_size": 8}, "1:glue_rte", (), "config key 'model' is missing"),
        (CONFIG, "1:glue_rte", ("--set", "model="), "'model' must name a built-in model or a model folder, got ''"),
        ({**CONFIG, "peft": 5}, "1:glue_rte", (), "config key 'peft' must be a mapping or a JSON file's path, got 5"),
        ({**CONFIG, "peft": {"r": 4, "lora_alhpa": 8}}, "1:glue_rte", (), "unknown LoRA spec key(s) 'lora_alhpa' in"),
        ({**CONFIG, "peft": {"r": 0}}, "1:glue_rte", (), "LoRA rank r must be a positive integer, got 0"),
        ({**CONFIG, "peft": {"rank": "four"}}, "1:glue_rte", (), "LoRA rank r must be a positive integer, got 'four'"),
        ({**CONFIG, "peft": {"dropout": 1.5}}, "1:glue_rte", (), "lora_dropout must be a number in [0, 1), got 1.5"),
    ],
)
def test_values_the_lora_worker_would_refuse_are_refused_at_submit(
    orch_cli: OrchRunner, tmp_path: Path, db_path: Path, config: dict[str, Any], pairs: str,
    extra: tuple[str, ...], needle: str,
) -> None:  # fmt: skip
    plans = write_plans(tmp_path, config)
    result = orch_cli("submit", "--suite", "tl", "--pairs", pairs, "--plans", str(plans), *extra)
    assert result.rc == 2, result
    assert needle in result.stderr and "suite tl, config c1" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not db_path.exists()


@pytest.mark.parametrize(
    ("key", "value", "shown"), [("max_steps", float("inf"), ".inf"), ("batch_size", float("nan"), ".nan")]
)
def test_a_config_number_that_is_not_finite_is_refused_before_the_worker_is_asked(
    orch_cli: OrchRunner, tmp_path: Path, db_path: Path, key: str, value: float, shown: str,
) -> None:  # fmt: skip
    plans = write_plans(tmp_path, {**CONFIG, key: value})
    result = orch_cli("submit", "--suite", "tl", "--pairs", "1:glue_rte", "--plans", str(plans))
    assert result.rc == 2, result
    assert f"c1.yaml: {key} is {shown}: a value must be a finite number" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not db_path.exists()


@pytest.mark.parametrize(
    ("space", "needle"),
    [
        ({"batch_size": {"int_uniform": [0, 8]}}, "search.space.batch_size int_uniform [0, 8]: config key 'batch_size' "
                                                  "must be a positive integer, got 0"),
        ({"prec": ["bf16", "fp16"]}, "search.space.prec 'fp16': config key 'prec' must be bf16 or fp32, got 'fp16'"),
        ({"eval_batch_size": {"uniform": [4, 32]}}, "search.space.eval_batch_size uniform [4, 32]: config key "
                                                    "'eval_batch_size' must be an integer"),
        ({"warmup_ratio": {"uniform": [0.0, 1.5]}}, "search.space.warmup_ratio uniform [0, 1.5]: config key "
                                                    "'warmup_ratio' must be at most 1, got 1.5"),  # not 1.49999...
    ],
)
def test_a_tpe_search_whose_later_trials_could_draw_a_value_the_worker_refuses_is_refused(
    orch_cli: OrchRunner, tmp_path: Path, db_path: Path, space: dict[str, Any], needle: str
) -> None:
    """TPE draws trial 0 at submit and the rest in the daemon: every choice and both bounds are
    checked at submit, not only the first trial's values."""
    pytest.importorskip("optuna")
    config = {**CONFIG, "prec": "bf16", "warmup_ratio": 0.0}
    search = {"method": "tpe", "trials": 4, "seed": 0, "metric": "val_loss", "mode": "min", "space": space}
    plans = write_plans(tmp_path, config, search=search)
    result = orch_cli("submit", "--suite", "tl", "--pairs", "1:glue_rte", "--plans", str(plans))
    assert result.rc == 2, result
    assert needle in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not db_path.exists()


def test_a_searchs_config_fault_is_named_as_the_configs(orch_cli: OrchRunner, tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    search = {"method": "tpe", "trials": 4, "seed": 0, "metric": "val_loss", "mode": "min",
              "space": {"learning_rate": {"log_uniform": [1.0e-5, 1.0e-2]}}}  # fmt: skip
    plans = write_plans(tmp_path, {**CONFIG, "batch_size": 8.5}, search=search)
    result = orch_cli("submit", "--suite", "tl", "--pairs", "1:glue_rte", "--plans", str(plans))
    assert result.rc == 2 and "config c1, task glue_rte: config key 'batch_size' must be an integer" in result.stderr


def test_a_search_whose_draws_the_worker_takes_is_accepted(orch_cli: OrchRunner, tmp_path: Path) -> None:
    """A uniform from 0 over a rate that must be positive draws 0 practically never: accepted."""
    pytest.importorskip("optuna")
    space = {"learning_rate": {"uniform": [0, 0.001]}, "batch_size": {"int_uniform": [2, 8]}}
    search = {"method": "tpe", "trials": 4, "seed": 0, "metric": "val_loss", "mode": "min", "space": space}
    plans = write_plans(tmp_path, CONFIG, search=search)
    result = orch_cli("submit", "--suite", "tl", "--pairs", "1:glue_rte", "--plans", str(plans), "--dry-run")
    assert result.rc == 0, result


def test_an_unknown_inline_peft_key_is_refused_at_submit_and_only_warned_of_by_the_worker(tmp_path: Path) -> None:
    """A job queued before the submit check must still run: the worker warns and trains."""
    from workers.lora.config import parse_config

    parsed = parse_config({**CONFIG, "data": "glue_rte", "peft": {"r": 4, "lora_alhpa": 8}}, tmp_path, {})
    assert parsed.peft == {"r": 4, "lora_alhpa": 8}  # the worker's LoRA spec warns of the key (peft_spec)


def test_the_worker_and_orch_name_the_same_tasks() -> None:
    from orchestrator.plans.lora_values import GLUE_TASKS
    from workers.lora.data import TASKS

    assert tuple(TASKS) == GLUE_TASKS


def test_known_and_orch_keys_are_accepted(orch_cli: OrchRunner, tmp_path: Path) -> None:
    config = {**CONFIG, "lr_scheduler": "linear", "warmup_ratio": 0.1, "max_grad_norm": 1.0,
              "sim_mem_gib": 3, "orch_note": "x", "host_mem_gib": 8, "cpus": 2}  # fmt: skip
    plans = write_plans(tmp_path, config)
    result = orch_cli(
        "submit", "--suite", "tl", "--pairs", "1:glue_rte", "--plans", str(plans), "--dry-run",
        "--set", "weight_decay=0", "--set", "eval_batch_size=32",
    )  # fmt: skip
    assert result.rc == 0, result
