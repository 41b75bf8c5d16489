"""Exact and inexact rungs: what each rung declares, the order of the default ladder, the names of
the rungs that changed an attempt's numbers, and the strict ladder (suite `ladder: strict`,
`orch submit --strict-ladder`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.errors import PlanError
from orchestrator.lifecycle import AttemptOutcome
from orchestrator.plans.ladder_spec import load_ladder, logits_exact, spec_steps, strict_spec
from orchestrator.prediction.ladder import (
    BATCH_KEY,
    expand_levels,
    first_inexact_level,
    inexact_rungs,
    retry_decision,
)
from orchestrator.store import Store
from tests.conftest import OrchRunner
from tests.store_reads import read_jobs

E1_CONFIG: dict[str, Any] = {
    "batch_size": 4, "gradient_accumulation_steps": 1, "gradient_checkpointing": False, "num_data_workers": 8,
}  # fmt: skip


def test_built_in_rungs_declare_what_they_keep() -> None:
    steps = load_ladder(["checkpointing", "logits_to_keep", {"data_workers": 0}, "run_alone", "halve_batch"]).rungs
    assert [(s.name, s.exact) for s in steps] == [
        ("checkpointing", True), ("logits_to_keep", True), ("data_workers", True), ("run_alone", True),
        ("halve_batch", False),
    ]  # fmt: skip


def test_a_set_rung_changes_numerics_unless_it_says_exact() -> None:
    steps = load_ladder([
        {"name": "fp32 optimizer", "set": {"optim": "adamw_torch"}},
        {"name": "compile off", "set": {"compile": False}, "exact": True},
        {"name": "my checkpointing", "checkpointing": True, "exact": False},
    ]).rungs
    assert [s.exact for s in steps] == [False, True, False]


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ([{"halve_batch": True, "exact": True}], "cannot be declared `exact: true`"),
        ([{"checkpointing": True, "exact": "yes"}], "`exact` takes true or false"),
        ([{"exact": True}], "at least one action"),
        ("lenient", "ladder must be a list of steps or 'strict'"),
        ({"strict": "yes", "steps": None}, "ladder mapping takes"),
        ({"strict": True, "rungs": []}, "ladder mapping takes"),
    ],
)
def test_bad_exactness_is_refused(spec: Any, needle: str) -> None:
    with pytest.raises(PlanError, match=None) as caught:
        load_ladder(spec)
    assert needle in str(caught.value)


def test_default_ladder_tries_every_exact_rung_first() -> None:
    for one_token in (True, False):
        levels = expand_levels(load_ladder(None), E1_CONFIG, one_token)
        flags = [level.exact for level in levels]
        first = first_inexact_level(levels)
        assert first is not None and not any(not f for f in flags[:first]) and not any(flags[first:])
        assert levels[first].changes == {BATCH_KEY: 2, "gradient_accumulation_steps": 2}


def test_inexact_rungs_names_what_changed_an_attempts_numbers() -> None:
    spec = ["checkpointing", "halve_batch", {"name": "fp32", "set": {"prec": "fp32"}}, "run_alone"]
    levels = expand_levels(load_ladder(spec), {"batch_size": 4}, one_token_task=False)
    assert [level.rung for level in levels] == [
        "as_configured", "checkpointing", "halve_batch", "halve_batch", "fp32", "run_alone",
    ]  # fmt: skip
    assert [inexact_rungs(levels, i) for i in range(len(levels))] == [
        (), (), ("halve_batch",), ("halve_batch",), ("halve_batch", "fp32"), ("halve_batch", "fp32"),
    ]  # fmt: skip
    default = expand_levels(load_ladder(None), E1_CONFIG, one_token_task=True)
    assert [inexact_rungs(default, i) for i in range(4)] == [(), (), (), ()]
    assert inexact_rungs(default, 4) == inexact_rungs(default, 5) == ("halve_batch",)


def test_logits_to_keep_is_exact_only_for_the_built_in_workers() -> None:
    ladder = load_ladder(None)
    built_in = expand_levels(ladder, E1_CONFIG, one_token_task=True, logits_exact=logits_exact("lora"))
    assert built_in[1].changes == {"gradient_checkpointing": True, "logits_to_keep": 1} and built_in[1].exact
    # a researcher's own script with dropout may draw other masks: the same rung changes numerics
    own = expand_levels(ladder, E1_CONFIG, one_token_task=True, logits_exact=logits_exact("python train.py"))
    assert own[1].changes == built_in[1].changes and not own[1].exact
    assert first_inexact_level(own) == 1 and inexact_rungs(own, 2) == ("checkpointing",)
    # no logits_to_keep change (a task scored on every token): the rung stays exact
    assert expand_levels(ladder, E1_CONFIG, one_token_task=False, logits_exact=False)[1].exact
    # the suite's own word overrules
    declared = load_ladder([{"checkpointing": True, "logits_to_keep": 1, "exact": True}])
    assert expand_levels(declared, E1_CONFIG, one_token_task=True, logits_exact=False)[1].exact
    # a strict ladder keeps checkpointing but leaves the logits_to_keep change out
    strict = expand_levels(load_ladder("strict"), E1_CONFIG, one_token_task=True, logits_exact=False)
    assert strict[1].changes == {"gradient_checkpointing": True} and all(level.exact for level in strict)


def test_strict_ladder_keeps_exact_rungs_only() -> None:
    strict = expand_levels(load_ladder("strict"), E1_CONFIG, one_token_task=True)
    assert [level.rung for level in strict] == ["as_configured", "checkpointing", "data_workers", "run_alone"]
    assert all(level.exact for level in strict) and first_inexact_level(strict) is None
    custom = [{"name": "fp32", "set": {"prec": "fp32"}}, "checkpointing", "halve_batch"]
    stored = strict_spec(custom)
    assert stored == {"strict": True, "steps": custom} and spec_steps(stored) == custom
    levels = expand_levels(load_ladder(json.loads(json.dumps(stored))), E1_CONFIG, one_token_task=False)
    assert [level.rung for level in levels] == ["as_configured", "checkpointing"]
    assert strict_spec("strict") == strict_spec(None) == {"strict": True, "steps": None}
    assert load_ladder(strict_spec(None)) == load_ladder("strict")


def test_strict_ladder_fails_saying_so_when_no_exact_rung_is_left() -> None:
    levels = expand_levels(load_ladder("strict"), E1_CONFIG, one_token_task=True)
    last = len(levels) - 1
    decision = retry_decision(AttemptOutcome.OOM, "CUDA out of memory", 4, levels, last, strict=True)
    assert decision.action == "fail"
    assert "every exact rung of the strict ladder" in decision.why and "CUDA out of memory" in decision.why
    assert retry_decision(AttemptOutcome.OOM, "oom", 1, levels, 0, strict=True).level == levels[1]


def _plans(root: Path, ladder: Any = None) -> Path:
    plans = root / "plans"
    (plans / "suites").mkdir(parents=True)
    (plans / "configs" / "s").mkdir(parents=True)
    (plans / "configs" / "s" / "c.yaml").write_text(yaml.safe_dump(E1_CONFIG))
    suite: dict[str, Any] = {"worker": "sim", "mem_gib": 1, "configs": ["c"]}
    if ladder is not None:
        suite["ladder"] = ladder
    (plans / "suites" / "s.yaml").write_text(yaml.safe_dump(suite))
    return plans


def _stored_ladders(db_path: Path) -> list[Any]:
    with Store(db_path, create=False) as store:
        return [json.loads(job.ladder_json) if job.ladder_json else None for job in read_jobs(store)]


def test_submit_strict_ladder_stores_a_strict_ladder(orch_cli: OrchRunner, tmp_path: Path, db_path: Path) -> None:
    plans = _plans(tmp_path)
    result = orch_cli("submit", "--suite", "s", "--pairs", "1:toy", "--plans", str(plans), "--strict-ladder")
    assert result.rc == 0, result.stderr
    assert _stored_ladders(db_path) == [{"strict": True, "steps": None}]


def test_suite_ladder_strict_is_stored_as_written(orch_cli: OrchRunner, tmp_path: Path, db_path: Path) -> None:
    plans = _plans(tmp_path, ladder="strict")
    assert orch_cli("submit", "--suite", "s", "--pairs", "2:toy", "--plans", str(plans)).rc == 0
    (stored,) = _stored_ladders(db_path)
    assert stored == "strict" and load_ladder(stored).strict


def test_a_suite_ladder_of_another_word_is_refused(orch_cli: OrchRunner, tmp_path: Path, db_path: Path) -> None:
    plans = _plans(tmp_path, ladder="lenient")
    result = orch_cli("submit", "--suite", "s", "--pairs", "1:toy", "--plans", str(plans))
    assert result.rc == 2 and "'lenient'" in result.stderr and not db_path.exists()
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_rung_that_only_runs_alone_is_passed_over_after_an_oom_alone() -> None:
    levels = expand_levels(load_ladder(None), {"batch_size": 4, "num_data_workers": 0}, one_token_task=False)
    assert [level.rung for level in levels] == ["as_configured", "checkpointing", "run_alone", "halve_batch",
                                                "halve_batch"]
    shared = retry_decision(AttemptOutcome.OOM, "CUDA out of memory", 2, levels, 1)
    assert shared.level == levels[2]  # beside another job: running alone may be what it needs
    alone = retry_decision(AttemptOutcome.OOM, "CUDA out of memory", 2, levels, 1, ran_alone=True)
    assert alone.level == levels[3] and "level 2 passed over" in alone.why
    # a rung that changes the settings is never passed over
    assert retry_decision(AttemptOutcome.OOM, "oom", 1, levels, 0, ran_alone=True).level == levels[1]
