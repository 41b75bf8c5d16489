"""The degradation ladder: schema validation, level expansion, and retry decisions."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.classify import REASON_HUNG
from orchestrator.errors import PlanError
from orchestrator.ladder import (
    ACCUM_KEY,
    BATCH_KEY,
    CHECKPOINTING_KEY,
    DEFAULT_LADDER_SPEC,
    LOGITS_KEY,
    WORKERS_KEY,
    Level,
    expand_levels,
    is_one_token_task,
    load_ladder,
    load_ladder_file,
    next_level,
    retry_decision,
    should_retry,
)
from orchestrator.lifecycle import AttemptOutcome

LADDER_YAML = Path(__file__).resolve().parent.parent / "plans" / "ladder.yaml"
E1_CONFIG: dict[str, Any] = {
    "model": "fla-hub/gla-1.3B-100B",
    "batch_size": 4,
    "gradient_accumulation_steps": 1,
    "gradient_checkpointing": False,
    "num_data_workers": 8,
    "max_seq_len": 256,
}
OOM, HOST_OOM = AttemptOutcome.OOM, AttemptOutcome.HOST_OOM


def _effective(level: Level, base: dict[str, Any]) -> dict[str, Any]:
    return {**base, **level.overrides}


def test_yaml_file_is_the_built_in_default() -> None:
    data = yaml.safe_load(LADDER_YAML.read_text(encoding="utf-8"))
    assert data["ladder"] == DEFAULT_LADDER_SPEC
    assert load_ladder_file(LADDER_YAML) == load_ladder(None)


def test_default_ladder_on_the_e1_config() -> None:
    levels = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=True)
    assert [level.step for level in levels] == [
        "as_configured", "checkpointing", "halve_batch", "halve_batch", "data_workers", "run_alone",
    ]  # fmt: skip
    assert [level.index for level in levels] == list(range(len(levels)))
    assert levels[0].overrides == {} and not levels[0].run_alone
    assert levels[1].changes == {CHECKPOINTING_KEY: True, LOGITS_KEY: 1}
    assert levels[2].changes == {BATCH_KEY: 2, ACCUM_KEY: 2}
    assert levels[3].changes == {BATCH_KEY: 1, ACCUM_KEY: 4}
    assert levels[4].changes == {WORKERS_KEY: 0}
    assert levels[5].changes == {} and levels[5].run_alone
    assert levels[5].overrides == {
        CHECKPOINTING_KEY: True, LOGITS_KEY: 1, BATCH_KEY: 1, ACCUM_KEY: 4, WORKERS_KEY: 0,
    }  # fmt: skip
    assert not any(level.run_alone for level in levels[:5])


def test_logits_to_keep_only_for_one_token_tasks() -> None:
    levels = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=False)
    assert levels[1].changes == {CHECKPOINTING_KEY: True}
    assert all(LOGITS_KEY not in level.overrides for level in levels)


def test_levels_that_change_nothing_are_skipped() -> None:
    already_lean = {
        **E1_CONFIG,
        "batch_size": 1,
        "gradient_checkpointing": True,
        "num_data_workers": 0,
    }
    levels = expand_levels(load_ladder(None), already_lean, one_token_task=False)
    assert [level.step for level in levels] == ["as_configured", "run_alone"]
    with_logits = expand_levels(load_ladder(None), already_lean, one_token_task=True)
    assert [level.step for level in with_logits] == ["as_configured", "checkpointing", "run_alone"]
    assert with_logits[1].changes == {LOGITS_KEY: 1}


@pytest.mark.parametrize(
    ("batch", "accum", "workers", "checkpointing"),
    list(
        itertools.product(
            [1, 2, 3, 4, 6, 7, 8, 12, 16, 30, 64], [1, 2, 3], [None, 0, 2, 8], [True, False]
        )
    ),
)
def test_effective_batch_is_invariant(
    batch: int, accum: int, workers: int | None, checkpointing: bool
) -> None:
    base: dict[str, Any] = {"batch_size": batch, "gradient_accumulation_steps": accum}
    base["gradient_checkpointing"] = checkpointing
    if workers is not None:
        base["num_data_workers"] = workers
    for one_token in (True, False):
        levels = expand_levels(load_ladder(None), base, one_token)
        for level in levels:
            config = _effective(level, base)
            assert config[BATCH_KEY] * config[ACCUM_KEY] == batch * accum
            assert level.changes or level.index == 0 or level.run_alone
        assert _effective(levels[-1], base)[BATCH_KEY] == 1  # the ladder reaches batch 1
        assert levels[-1].run_alone
        batches = [_effective(level, base)[BATCH_KEY] for level in levels]
        assert batches == sorted(batches, reverse=True)


def test_bare_logits_to_keep_means_one() -> None:
    levels = expand_levels(load_ladder(["logits_to_keep"]), {}, one_token_task=True)
    assert levels[1].changes == {LOGITS_KEY: 1}


def test_missing_accumulation_counts_as_one() -> None:
    levels = expand_levels(load_ladder(["halve_batch"]), {"batch_size": 8}, one_token_task=False)
    assert [level.overrides for level in levels[1:]] == [
        {BATCH_KEY: 4, ACCUM_KEY: 2}, {BATCH_KEY: 2, ACCUM_KEY: 4}, {BATCH_KEY: 1, ACCUM_KEY: 8},
    ]  # fmt: skip
    assert expand_levels(load_ladder(["halve_batch"]), {}, one_token_task=False)[1:] == []


def test_custom_ladder_with_set_and_names() -> None:
    spec = [
        {"name": "no-dropout", "set": {"lora_dropout": 0.0}},
        {"data_workers": 2},
        {"name": "lean", "checkpointing": True, "run_alone": True},
    ]
    levels = expand_levels(load_ladder(spec), E1_CONFIG, one_token_task=True)
    assert [level.step for level in levels] == [
        "as_configured",
        "no-dropout",
        "data_workers",
        "lean",
    ]
    assert levels[1].changes == {"lora_dropout": 0.0}
    assert levels[2].changes == {WORKERS_KEY: 2}
    assert levels[3].changes == {CHECKPOINTING_KEY: True} and levels[3].run_alone
    # data_workers never raises the worker count
    assert (
        len(expand_levels(load_ladder([{"data_workers": 2}]), {"num_data_workers": 0}, False)) == 1
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("halve_batch", "must be a list"),
        ([{"shrink": True}], "unknown action 'shrink'"),
        (["data_workers"], "can stand alone"),
        ([{"data_workers": -1}], "integer >= 0"),
        ([{"data_workers": True}], "integer >= 0"),
        ([{"logits_to_keep": 0}], "positive integer"),
        ([{"checkpointing": False}], "takes only `true`"),
        ([{"halve_batch": True, "run_alone": True}], "step of its own"),
        ([{"set": {"batch_size": 2}}], "use halve_batch"),
        ([{"set": {}}], "non-empty mapping"),
        ([{"set": {"lr": [1, 2]}}], "must be a scalar"),
        ([{"name": "only a name"}], "at least one action"),
        ([42], "expected an action name or a mapping"),
    ],
)
def test_invalid_ladders_are_plan_errors(spec: Any, message: str) -> None:
    with pytest.raises(PlanError, match="ladder") as caught:
        load_ladder(spec)
    assert message in str(caught.value)


def test_invalid_ladder_file(tmp_path: Path) -> None:
    path = tmp_path / "ladder.yaml"
    path.write_text("steps: []\n", encoding="utf-8")
    with pytest.raises(PlanError, match="`ladder:` list"):
        load_ladder_file(path)
    path.write_text("ladder: [{data_workers: x}]\n", encoding="utf-8")
    with pytest.raises(PlanError, match=r"ladder file .*step 1"):
        load_ladder_file(path)


def test_next_level_on_oom_and_host_oom() -> None:
    levels = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=True)
    assert next_level(levels, 0, OOM) == levels[1]
    assert next_level(levels, 4, OOM) == levels[5]
    assert next_level(levels, 5, OOM) is None
    # host OOM skips GPU-side rungs: first fewer data workers, then running alone
    assert next_level(levels, 0, HOST_OOM) == levels[4]
    assert next_level(levels, 4, HOST_OOM) == levels[5]
    assert next_level(levels, 5, HOST_OOM) is None
    assert next_level(levels, 0, AttemptOutcome.FAILED) is None
    no_workers = expand_levels(load_ladder(None), {**E1_CONFIG, "num_data_workers": 0}, True)
    target = next_level(no_workers, 0, HOST_OOM)
    assert target is not None and target.run_alone and target.step == "run_alone"


def test_should_retry() -> None:
    assert should_retry(OOM, 1, 8, True)
    assert should_retry(AttemptOutcome.LOST, 7, 8, True)
    assert not should_retry(OOM, 8, 8, True)
    assert not should_retry(OOM, 1, 8, False)
    assert not should_retry(AttemptOutcome.FAILED, 1, 8, True)
    assert not should_retry(AttemptOutcome.SUCCEEDED, 1, 8, True)


def test_retry_decision_walks_the_ladder_until_exhausted() -> None:
    levels = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=True)
    index, attempts, decisions = 0, 0, []
    while True:
        attempts += 1
        decision = retry_decision(OOM, "CUDA out of memory", attempts, levels, index, 20)
        decisions.append(decision.action)
        if decision.action != "requeue":
            break
        assert decision.level is not None and decision.level.index == index + 1
        index = decision.level.index
    assert decisions == ["requeue"] * 5 + ["fail"]
    assert "every level" in decision.why and "CUDA out of memory" in decision.why


def test_retry_decision_respects_max_attempts() -> None:
    levels = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=True)
    decision = retry_decision(OOM, "CUDA out of memory", 3, levels, 1, max_attempts=3)
    assert decision.action == "fail" and "gave up after 3 attempts" in decision.why


def test_retry_decision_other_outcomes() -> None:
    levels = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=True)
    done = retry_decision(AttemptOutcome.SUCCEEDED, "exit code 0", 1, levels, 2)
    assert (done.action, done.level) == ("done", None)
    assert retry_decision(AttemptOutcome.CANCELLED, "cancelled", 1, levels, 0).action == "done"
    lost = retry_decision(AttemptOutcome.LOST, "no exit record", 2, levels, 3)
    assert lost.action == "requeue" and lost.level == levels[3]
    failed = retry_decision(AttemptOutcome.FAILED, "KeyError: 'label'", 1, levels, 0)
    assert failed.action == "fail" and "KeyError" in failed.why
    config_error = retry_decision(
        AttemptOutcome.FAILED, "config error: x", 1, levels, 0, retryable=False
    )
    assert config_error.action == "fail" and "not retryable" in config_error.why
    host = retry_decision(HOST_OOM, "DataLoader worker killed", 1, levels, 0)
    assert host.action == "requeue" and host.level == levels[4]


def test_hung_is_retried_once_unchanged() -> None:
    levels = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=True)
    first = retry_decision(AttemptOutcome.FAILED, REASON_HUNG, 2, levels, 1, hung_retries_so_far=0)
    assert first.action == "requeue" and first.level == levels[1]
    second = retry_decision(AttemptOutcome.FAILED, REASON_HUNG, 3, levels, 1, hung_retries_so_far=1)
    assert second.action == "fail" and second.why == REASON_HUNG


def test_is_one_token_task() -> None:
    assert is_one_token_task("glue-tvt_qnli", ["glue*"])
    assert is_one_token_task("glue_rte", ["squad", "glue_*"])
    assert not is_one_token_task("squad", ["glue*"])
    assert not is_one_token_task("glue-tvt_qnli", [])
