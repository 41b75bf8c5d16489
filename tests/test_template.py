"""Worker command templates ({cfg.KEY}, flags), the keys: mapping, and rungs a worker cannot receive."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import PlanError, UsageError
from orchestrator.executors.run_dir import build_argv
from orchestrator.plans.keymap import KeyMap, parse_keys
from orchestrator.plans.ladder_spec import load_ladder
from orchestrator.plans.template import check_config_keys, parse_template
from orchestrator.prediction.ladder import expand_levels

TEMPLATE = (
    "python train.py --cfg-free --batch-size {cfg.batch_size} --grad-accum={cfg.gradient_accumulation_steps} "
    "{cfg.gradient_checkpointing?--gradient-checkpointing} --lr {cfg.learning_rate} --tag '{cfg.name} x'"
)


def fill(template: str, config: dict[str, Any]) -> list[str]:
    return build_argv(template, config_path=Path("/r/config.yaml"), run_dir=Path("/r"), values={}, config=config)


def test_cfg_values_render_as_argparse_reads_them() -> None:
    config = {"batch_size": 16, "gradient_accumulation_steps": 2, "gradient_checkpointing": True,
              "learning_rate": 3e-05, "name": "a; rm -rf ~"}
    assert fill(TEMPLATE, config) == [
        "python", "train.py", "--cfg-free", "--batch-size", "16", "--grad-accum=2", "--gradient-checkpointing",
        "--lr", "3e-05", "--tag", "a; rm -rf ~ x",
    ]


def test_false_flag_leaves_the_argument_out() -> None:
    config = {"batch_size": 32, "gradient_accumulation_steps": 1, "gradient_checkpointing": False,
              "learning_rate": 0.001, "name": "n"}
    argv = fill(TEMPLATE, config)
    assert "--gradient-checkpointing" not in argv and "" not in argv
    assert argv[argv.index("--batch-size") + 1] == "32"


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        (True, "true"),
        (False, "false"),
        (7, "7"),
        (0.5, "0.5"),
        ("x y", "x y"),
        ([1, 2], "[1,2]"),
        ({"a": 1}, '{"a":1}'),
    ],
)
def test_value_rendering(value: Any, rendered: str) -> None:
    assert fill("t --v={cfg.k}", {"k": value}) == ["t", f"--v={rendered}"]


@pytest.mark.parametrize(
    ("value", "given"),
    [(True, True), (1, True), ("yes", True), ("off", False), (0, False), (None, False)],
)
def test_flag_truth(value: Any, given: bool) -> None:
    assert fill("t {cfg.k?--k}", {"k": value}) == (["t", "--k"] if given else ["t"])


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ("python t.py --batch-size {batch_size}", r"unknown placeholder \{batch_size\}.*\{cfg\.KEY\}"),
        ("python t.py {cfg.}", "unknown placeholder"),
        ("python t.py '{cfg.a b}'", "unknown placeholder"),
        ("python t.py {cfg.a b}", "lone"),
        ("python t.py {cfg.a:>3}", "unknown placeholder"),
        ("python t.py }", "lone"),
    ],
)
def test_bad_templates(template: str, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        parse_template(template)
    with pytest.raises(UsageError, match=match):  # the launch path refuses it the same way
        fill(template, {})


def test_missing_value_at_fill_time() -> None:
    with pytest.raises(PlanError, match="no value for batch_size"):
        fill("t {cfg.batch_size}", {})


def test_check_config_keys() -> None:
    template = parse_template("t {cfg.batch_size} {cfg.gradient_checkpointing?--gc} {cfg.fp16?--fp16}")
    configs = {"a": {"batch_size": 4, "fp16": True}, "b": {"batch_size": 8}}
    check_config_keys(template, configs, settable={"gradient_checkpointing"})
    with pytest.raises(PlanError, match=r"config b has no value for 'batch_size'"):
        check_config_keys(template, {**configs, "b": {}}, settable={"gradient_checkpointing"})
    with pytest.raises(PlanError, match=r"no config of the suite has 'gradient_checkpointing'"):
        check_config_keys(template, configs, settable=set())


def test_reaches() -> None:
    flags = parse_template("t --bs {cfg.batch_size} {cfg.gradient_checkpointing?--gc}")
    assert flags.reaches("batch_size") and flags.reaches("gradient_checkpointing")
    assert not flags.reaches("gradient_accumulation_steps")
    assert parse_template("t --cfg {config}").reaches("anything")
    assert not parse_template("t --out {run_dir}").reaches("batch_size")


HF = KeyMap({"batch_size": "per_device_train_batch_size", "gradient_checkpointing": "gradient_checkpointing",
             "num_data_workers": "dataloader_num_workers"})


def test_keymap_round_trip() -> None:
    config = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "batch_size": "unrelated",
              "dataloader_num_workers": 2, "learning_rate": 1e-4}
    view = HF.to_orch(config)
    assert view == {"batch_size": 8, "gradient_accumulation_steps": 1, "num_data_workers": 2, "learning_rate": 1e-4}
    assert HF.to_script({"batch_size": 4, "gradient_accumulation_steps": 2, "num_data_workers": 0}) == {
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "dataloader_num_workers": 0}


def test_keymap_ladder_keeps_the_product_under_the_script_names() -> None:
    config = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "dataloader_num_workers": 4}
    levels = expand_levels(load_ladder(None), HF.to_orch(config), one_token_task=False)
    for level in levels[1:]:
        merged = {**config, **HF.to_script(level.overrides)}
        assert merged["per_device_train_batch_size"] * merged["gradient_accumulation_steps"] == 16
        assert "batch_size" not in merged
    last = {**config, **HF.to_script(levels[-1].overrides)}
    assert last["per_device_train_batch_size"] == 1 and last["dataloader_num_workers"] == 0


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"batchsize": "x"}, "unknown knob 'batchsize'"),
        ({"batch_size": ""}, "must be a config key name"),
        ({"batch_size": "a", "accumulation": "a"}, "two knobs"),
        ({"checkpointing": "c", "gradient_checkpointing": "d"}, "twice"),
        ({"batch_size": "gradient_accumulation_steps"}, "another knob's own name"),
        (["batch_size"], "must be a mapping"),
    ],
)
def test_bad_keys(raw: Any, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        parse_keys(raw, "suite s")


def test_rungs_the_worker_cannot_receive_are_skipped() -> None:
    config = {"batch_size": 32, "gradient_accumulation_steps": 1, "num_data_workers": 2}
    template = parse_template(
        "python t.py --batch-size {cfg.batch_size} --grad-accum {cfg.gradient_accumulation_steps}"
    )
    levels = expand_levels(load_ladder(None), config, one_token_task=True, reaches=template.reaches)
    steps = [level.rung for level in levels]
    # checkpointing/logits_to_keep and data workers never reach the script; running alone always can
    assert steps == ["as_configured", "run_alone"] + ["halve_batch"] * 5
    assert levels[2].changes == {"batch_size": 16, "gradient_accumulation_steps": 2}
    nothing = parse_template("python t.py --out {run_dir}")
    levels = expand_levels(load_ladder(None), config, one_token_task=True, reaches=nothing.reaches)
    assert [level.rung for level in levels] == ["as_configured", "run_alone"]


def test_half_wired_batch_is_not_halved() -> None:
    config = {"batch_size": 32, "gradient_accumulation_steps": 1}
    template = parse_template("python t.py --batch-size {cfg.batch_size}")  # accumulation never reaches it
    levels = expand_levels(load_ladder(None), config, one_token_task=False, reaches=template.reaches)
    assert all("batch_size" not in level.changes for level in levels)
