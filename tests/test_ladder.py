"""The degradation ladder: schema validation, level expansion, and retry decisions."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.errors import PlanError
from orchestrator.lifecycle import REASON_HUNG, AttemptOutcome
from orchestrator.plans.ladder_spec import is_one_token_task, load_ladder, load_ladder_file
from orchestrator.prediction.ladder import (
    ACCUM_KEY,
    BATCH_KEY,
    CHECKPOINTING_KEY,
    DEFAULT_LADDER_SPEC,
    LOGITS_KEY,
    NO_HOST_STEPS,
    WORKERS_KEY,
    HostSettings,
    Level,
    expand_levels,
    next_host_step,
    retry_decision,
    with_host_settings,
)

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
    # every exact rung before any that changes numerics
    assert [level.rung for level in levels] == [
        "as_configured", "checkpointing", "data_workers", "run_alone", "halve_batch", "halve_batch",
    ]  # fmt: skip
    assert [level.exact for level in levels] == [True, True, True, True, False, False]
    assert [level.index for level in levels] == list(range(len(levels)))
    assert levels[0].overrides == {} and not levels[0].run_alone
    assert levels[1].changes == {CHECKPOINTING_KEY: True, LOGITS_KEY: 1}
    assert levels[2].changes == {WORKERS_KEY: 0}
    assert levels[3].changes == {} and levels[3].run_alone
    assert levels[4].changes == {BATCH_KEY: 2, ACCUM_KEY: 2}
    assert levels[5].changes == {BATCH_KEY: 1, ACCUM_KEY: 4}
    assert levels[5].overrides == {
        CHECKPOINTING_KEY: True, LOGITS_KEY: 1, BATCH_KEY: 1, ACCUM_KEY: 4, WORKERS_KEY: 0,
    }  # fmt: skip
    assert not any(level.run_alone for level in levels[:3]) and all(level.run_alone for level in levels[3:])


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
    assert [level.rung for level in levels] == ["as_configured", "run_alone"]
    with_logits = expand_levels(load_ladder(None), already_lean, one_token_task=True)
    assert [level.rung for level in with_logits] == ["as_configured", "checkpointing", "run_alone"]
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
    assert [level.rung for level in levels] == [
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


GPU_SIDE_KEYS = (BATCH_KEY, ACCUM_KEY, CHECKPOINTING_KEY, LOGITS_KEY)


def _gpu_side(level: Level, base: dict[str, Any]) -> dict[str, Any]:
    config = _effective(level, base)
    return {key: config.get(key) for key in GPU_SIDE_KEYS}


def _next_attempt(levels: list[Level], index: int, outcome: AttemptOutcome) -> Level | None:
    """What the attempt after this one runs with (host settings applied), by retry_decision."""
    decision = retry_decision(outcome, "out of memory", 1, levels, index)
    if decision.action != "requeue":
        return None
    assert decision.level is not None
    return with_host_settings(decision.level, decision.host)


def test_the_attempt_after_an_oom_and_a_host_oom() -> None:
    levels = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=True)
    assert _next_attempt(levels, 0, OOM) == levels[1]
    assert _next_attempt(levels, 4, OOM) == levels[5]
    assert _next_attempt(levels, 5, OOM) is None
    assert _next_attempt(levels, 0, AttemptOutcome.FAILED) is None
    # A host OOM stays at its level and adds only the host-side part of the next host rung.
    host = _next_attempt(levels, 0, HOST_OOM)
    assert host == Level(0, "data_workers", {WORKERS_KEY: 0}, {WORKERS_KEY: 0}, run_alone=False)
    at_one = _next_attempt(levels, 1, HOST_OOM)
    assert at_one is not None and at_one.index == 1
    assert at_one.overrides == {**levels[1].overrides, WORKERS_KEY: 0}
    assert at_one.changes == {WORKERS_KEY: 0}
    # Where the level already runs without workers, the next host step is running alone.
    alone = _next_attempt(levels, 2, HOST_OOM)
    assert alone is not None and alone.run_alone and alone.rung == "run_alone"
    assert alone.overrides == levels[2].overrides and alone.changes == {}
    assert _next_attempt(levels, 5, HOST_OOM) is None


def test_host_step_takes_fewer_workers_then_run_alone_then_nothing() -> None:
    levels = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=True)
    first = next_host_step(levels, 1, NO_HOST_STEPS)
    assert first is not None
    assert first.overrides == {WORKERS_KEY: 0} and not first.run_alone
    assert [(s.level, s.rung) for s in first.steps] == [(1, "data_workers")]
    second = next_host_step(levels, 1, first)
    assert second is not None and second.run_alone
    assert second.overrides == {WORKERS_KEY: 0}
    assert [(s.level, s.rung, s.changes) for s in second.steps] == [
        (1, "data_workers", {WORKERS_KEY: 0}), (1, "run_alone", {}),
    ]  # fmt: skip
    assert next_host_step(levels, 1, second) is None


def test_host_steps_leave_gpu_side_settings_alone() -> None:
    levels = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=True)
    for index in range(len(levels)):
        host, ran = NO_HOST_STEPS, levels[index]
        while (stepped := next_host_step(levels, index, host)) is not None:
            attempt = with_host_settings(levels[index], stepped)
            assert attempt.index == index
            assert _gpu_side(attempt, E1_CONFIG) == _gpu_side(levels[index], E1_CONFIG)
            assert set(attempt.changes) <= {WORKERS_KEY}
            assert attempt != ran  # each step changes something host-side
            host, ran = stepped, attempt
        assert with_host_settings(levels[index], host).run_alone


def test_host_step_follows_a_custom_ladders_rungs() -> None:
    spec = ["checkpointing", {"data_workers": 4}, "halve_batch", {"data_workers": 1}, "run_alone"]
    levels = expand_levels(load_ladder(spec), E1_CONFIG, one_token_task=False)
    steps: list[dict[str, Any]] = []
    host = NO_HOST_STEPS
    while (stepped := next_host_step(levels, 0, host)) is not None:
        host = stepped
        steps.append({**host.steps[-1].changes, "alone": host.steps[-1].run_alone})
    assert steps == [
        {WORKERS_KEY: 4, "alone": False}, {WORKERS_KEY: 1, "alone": False}, {"alone": True},
    ]  # fmt: skip
    # A mixed rung gives only its host-side part.
    mixed = expand_levels(
        load_ladder([{"checkpointing": True, "data_workers": 0}]), E1_CONFIG, one_token_task=False
    )
    only_workers = next_host_step(mixed, 0)
    assert only_workers is not None and only_workers.overrides == {WORKERS_KEY: 0}
    assert CHECKPOINTING_KEY not in with_host_settings(mixed[0], only_workers).overrides
    # A job already without workers on a ladder with no run_alone has nothing host-side left.
    lean = expand_levels(load_ladder(["checkpointing", {"data_workers": 0}]),
                         {**E1_CONFIG, WORKERS_KEY: 0}, one_token_task=False)  # fmt: skip
    assert next_host_step(lean, 0) is None


def test_a_cuda_oom_after_a_host_step_keeps_it() -> None:
    levels = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=True)
    host = retry_decision(HOST_OOM, "DefaultCPUAllocator", 1, levels, 0)
    assert host.action == "requeue" and host.level == levels[0]
    assert host.host.overrides == {WORKERS_KEY: 0}
    cuda = retry_decision(OOM, "CUDA out of memory", 2, levels, 0, host=host.host)
    assert cuda.action == "requeue" and cuda.level == levels[1]
    assert cuda.host == host.host  # kept, not taken again
    attempt = with_host_settings(levels[1], cuda.host)
    assert attempt.overrides == {**levels[1].overrides, WORKERS_KEY: 0}
    assert attempt.changes == levels[1].changes and attempt.rung == "checkpointing"
    assert "num_data_workers" not in cuda.why.split("next")[1]
    # A lost attempt is requeued with the same settings; a success keeps them too.
    lost = retry_decision(AttemptOutcome.LOST, "no exit record", 3, levels, 1, host=cuda.host)
    assert (lost.level, lost.host) == (levels[1], cuda.host)


def test_a_level_that_lowers_workers_further_wins_over_the_host_step() -> None:
    spec = [{"data_workers": 2}, {"data_workers": 0}]
    levels = expand_levels(load_ladder(spec), E1_CONFIG, one_token_task=False)
    two = HostSettings.from_records([{"level": 0, "step": "w", "changes": {WORKERS_KEY: 2}}])
    assert with_host_settings(levels[2], two).overrides == {WORKERS_KEY: 0}
    assert with_host_settings(levels[0], two).overrides == {WORKERS_KEY: 2}


def test_host_settings_round_trip_through_records() -> None:
    levels = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=True)
    first = next_host_step(levels, 1)
    assert first is not None
    both = next_host_step(levels, 1, first)
    assert both is not None
    assert HostSettings.from_records(both.to_records()) == both
    assert HostSettings.from_records([]) == NO_HOST_STEPS
    assert with_host_settings(levels[3], NO_HOST_STEPS) is levels[3]


def test_which_outcomes_are_retried_at_all() -> None:
    levels = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=True)

    def action(outcome: AttemptOutcome, attempts: int, retryable: bool = True) -> str:
        return retry_decision(outcome, "why", attempts, levels, 0, 8, retryable=retryable).action

    assert action(OOM, 1) == "requeue"
    assert action(AttemptOutcome.LOST, 7) == "requeue"
    assert action(OOM, 8) == "fail"  # out of attempts
    assert action(AttemptOutcome.FAILED, 1) == "fail"
    assert action(AttemptOutcome.SUCCEEDED, 1) == "done"
    assert action(AttemptOutcome.CANCELLED, 1) == "done"


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
    assert host.action == "requeue" and host.level == levels[0]
    assert host.host.overrides == {WORKERS_KEY: 0} and not host.host.run_alone
    assert "num_data_workers=0" in host.why and "checkpointing" not in host.why


def test_host_oom_with_nothing_host_side_left_fails() -> None:
    levels = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=True)
    host = NO_HOST_STEPS
    for attempts in (1, 2):
        decision = retry_decision(HOST_OOM, "Killed", attempts, levels, 1, host=host)
        assert decision.action == "requeue" and decision.level == levels[1]
        host = decision.host
    assert host.run_alone and host.overrides == {WORKERS_KEY: 0}
    last = retry_decision(HOST_OOM, "Killed", 3, levels, 1, host=host)
    assert last.action == "fail" and last.level is None
    assert "no host-side step left" in last.why and "Killed" in last.why
    out = retry_decision(HOST_OOM, "Killed", 8, levels, 0, max_attempts=8)
    assert out.action == "fail" and "gave up after 8 attempts" in out.why


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


def test_an_explicit_eval_batch_is_scaled_with_the_batch() -> None:
    base = {"batch_size": 8, "gradient_accumulation_steps": 1, "eval_batch_size": 12}
    levels = expand_levels(load_ladder(["halve_batch"]), base, one_token_task=False)
    assert [lv.changes for lv in levels[1:]] == [
        {"batch_size": 4, "gradient_accumulation_steps": 2, "eval_batch_size": 6},
        {"batch_size": 2, "gradient_accumulation_steps": 4, "eval_batch_size": 3},
        {"batch_size": 1, "gradient_accumulation_steps": 8, "eval_batch_size": 1},
    ]
    unreached = expand_levels(load_ladder(["halve_batch"]), base, False, reaches=lambda key: key != "eval_batch_size")
    assert "eval_batch_size" not in unreached[1].changes
