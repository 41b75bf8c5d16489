"""The suite key `share_base` (off | sequential | fused): read at submit, refused in one line
where it cannot apply, and turned into the attempt's environment for the built-in LoRA worker."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.errors import PlanError
from orchestrator.plans import load_suite
from orchestrator.scheduling.launching import share_env
from tests.test_plans import write_suite

CONFIG = {"c1": {"model": "tiny-llama", "peft": {"r": 4}, "data": "glue-tvt_rte"}}


def suite_with(tmp_path: Path, worker: str, share_base: Any = None, unset: bool = False) -> Any:
    body: dict[str, Any] = {"worker": worker, "mem_gib": 2, "configs": ["c1"]}
    if not unset:
        body["share_base"] = share_base
    write_suite(tmp_path, "s", body, CONFIG)
    return load_suite("s", tmp_path)


def test_sequential_is_the_default_of_the_lora_worker_and_off_of_any_other(tmp_path: Path) -> None:
    lora = suite_with(tmp_path, "lora", unset=True)
    assert lora.share_base == "sequential" and lora.worker_output["share_base"] == "sequential"
    assert suite_with(tmp_path, "sim", unset=True).share_base == "off"
    command = suite_with(tmp_path, "python train.py {config}", unset=True)
    assert command.share_base == "off" and "share_base" not in command.worker_output


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("off", "off"), (False, "off"), ("sequential", "sequential"), ("Sequential", "sequential")],
)
def test_share_base_values(tmp_path: Path, raw: Any, expected: str) -> None:
    assert suite_with(tmp_path, "lora", raw).share_base == expected


@pytest.mark.parametrize("raw", ["yes", "parallel", 2, ["sequential"], True])
def test_another_value_is_refused_in_one_line(tmp_path: Path, raw: Any) -> None:
    with pytest.raises(
        PlanError, match=r"`share_base` must be off, sequential or fused, not"
    ) as caught:
        suite_with(tmp_path, "lora", raw)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("worker", ["sim", "python train.py {config}"])
def test_sharing_on_a_worker_that_cannot_share_is_refused(tmp_path: Path, worker: str) -> None:
    with pytest.raises(PlanError, match=r"`share_base: sequential` needs the built-in LoRA worker"):
        suite_with(tmp_path, worker, "sequential")
    assert suite_with(tmp_path, worker, "off").share_base == "off"


def test_fused_is_accepted_with_its_group_size(tmp_path: Path) -> None:
    suite = suite_with(tmp_path, "lora", "fused")
    assert suite.share_base == "fused" and suite.fused_members == 4
    assert suite.worker_output["share_base"] == "fused" and suite.worker_output["fused_members"] == 4
    write_suite(tmp_path, "s", {"worker": "lora", "mem_gib": 2, "configs": ["c1"], "share_base": "fused",
                                "fused_members": 8}, CONFIG)
    assert load_suite("s", tmp_path).worker_output["fused_members"] == 8


@pytest.mark.parametrize(
    ("share_base", "members", "said"),
    [("fused", 1, "must be a whole number from 2 to 16, not 1"), ("fused", 17, "from 2 to 16, not 17"),
     ("fused", "4", "not '4'"), ("fused", True, "not True"), ("fused", 2.5, "not 2.5"),
     ("sequential", 4, "applies only with `share_base: fused`"), ("off", 4, "applies only with")],
)
def test_fused_members_out_of_range_or_without_fused_is_refused_in_one_line(
    tmp_path: Path, share_base: str, members: Any, said: str
) -> None:
    write_suite(tmp_path, "s", {"worker": "lora", "mem_gib": 2, "configs": ["c1"], "share_base": share_base,
                                "fused_members": members}, CONFIG)
    with pytest.raises(PlanError, match=re.escape(said)) as caught:
        load_suite("s", tmp_path)
    assert "\n" not in str(caught.value)


def test_fused_on_a_worker_that_cannot_share_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"`share_base: fused` needs the built-in LoRA worker"):
        suite_with(tmp_path, "python train.py {config}", "fused")


def test_a_fused_attempt_is_told_its_group_cap() -> None:
    runs = Path("/r")
    fused = _job("lora", {"share_base": "fused", "fused_members": 6})
    env = share_env(fused, 1, False, True, runs)
    assert env == {"ORCH_SHARE_BASE": "fused", "ORCH_SHARE_DIR": "/r/.warm", "ORCH_FUSE_MAX": "6",
                   "ORCH_FUSE_SUITE": fused.suite}  # the worker joins only its own suite's group
    assert share_env(fused, 1, False, True, runs, fused_cap=3)["ORCH_FUSE_MAX"] == "3"  # after a group OOM
    assert share_env(fused, 1, False, True, runs, fused_cap=8)["ORCH_FUSE_MAX"] == "6"  # never above the suite's
    assert share_env(_job("lora", {"share_base": "fused"}), 1, False, True, runs)["ORCH_FUSE_MAX"] == "4"
    assert share_env(fused, 1, True, True, runs) == {"ORCH_SHARE_DIR": "/r/.warm"}  # the ladder runs it alone
    assert "ORCH_FUSE_MAX" not in share_env(_job("lora", {"share_base": "sequential"}), 1, False, True, runs)


def test_an_attempt_is_pointed_at_a_warm_process_only_where_it_can_use_one(tmp_path: Path) -> None:
    sharing = {"share_base": "sequential"}
    runs = tmp_path / "runs"
    assert share_env(_job("lora", sharing), 1, False, True, runs) == {
        "ORCH_SHARE_BASE": "sequential",
        "ORCH_SHARE_DIR": str(runs / ".warm"),
    }
    # no warm process, but the folder, where a resume waits for a warm process's job to stop
    folder = {"ORCH_SHARE_DIR": str(runs / ".warm")}
    assert share_env(_job("lora", {}), 1, False, True, runs) == folder  # share_base: off
    assert share_env(_job("sim", sharing), 1, False, True, runs) == {}
    assert share_env(_job("lora", sharing), 2, False, True, runs) == folder  # a gang
    assert share_env(_job("lora", sharing), 1, True, True, runs) == folder  # the ladder runs it alone
    assert share_env(_job("lora", sharing), 1, False, False, runs) == {}  # a cluster node


def _job(worker: str, worker_output: dict[str, Any]) -> Any:
    return SimpleNamespace(worker=worker, worker_output=worker_output, suite="E1")  # what share_env reads


def test_a_warm_process_job_counts_the_peak_its_worker_reports() -> None:
    """The attempt's own processes (the client) hold no GPU memory: the running peak of a shape
    trained in a warm process comes from its progress lines, never from text or junk there."""
    from orchestrator.attempts.warm_peak import shared_base_peak_mib

    sharing = _job("lora", {"share_base": "sequential"})
    assert shared_base_peak_mib(sharing, {"step": 3, "peak_mem_mib": 15_700}) == 15_700
    assert shared_base_peak_mib(_job("lora", {}), {"peak_mem_mib": 15_700}) == 0  # its own process
    assert shared_base_peak_mib(_job("sim", {}), {"peak_mem_mib": 15_700}) == 0
    for junk in ("15700", True, -1, 1e30, None, float("nan")):
        assert shared_base_peak_mib(sharing, {"peak_mem_mib": junk}) == 0
    assert shared_base_peak_mib(sharing, None) == 0


def test_one_enum_names_the_modes_and_a_stored_text_that_is_none_of_them_is_off() -> None:
    from orchestrator.plans.model import ShareBase
    from orchestrator.prediction.fused_groups import fused, share_base, shares_base

    assert [ShareBase.of(text) for text in ("off", "sequential", "fused", "Fused", ["fused"], None)] == [
        ShareBase.OFF, ShareBase.SEQUENTIAL, ShareBase.FUSED, None, None, None]

    def job(stored: object, worker: str = "lora") -> Any:
        return SimpleNamespace(worker=worker, worker_output={"share_base": stored})

    assert share_base(job("fused")) is ShareBase.FUSED and fused(job("fused"))
    assert share_base(job("sequential")) is ShareBase.SEQUENTIAL and not fused(job("sequential"))
    for odd in ("shared", 1, None, ["fused"]):  # a row edited by hand: no warm process
        assert share_base(job(odd)) is ShareBase.OFF and not shares_base(job(odd))
    assert share_base(job("fused", worker="sim")) is ShareBase.OFF


@pytest.mark.parametrize(("mode", "said"), [
    ("fused", "share_base: fused: up to 3 jobs of one base train at once in a process"),
    ("sequential", "share_base: sequential: a warm LoRA worker process per card slot and base"),
])
def test_submit_says_how_the_jobs_will_share_a_base(orch_inproc: Any, tmp_path: Path, mode: str, said: str) -> None:
    body: dict[str, Any] = {"worker": "lora", "mem_gib": 2, "configs": ["c1"], "share_base": mode}
    if mode == "fused":
        body["fused_members"] = 3
    write_suite(tmp_path / "plans", "s", body, CONFIG)
    plans = str(tmp_path / "plans")
    for extra in (["--dry-run"], []):
        done = orch_inproc("submit", "--plans", plans, "--suite", "s", "--pairs", "1:glue_rte 2:glue_rte", *extra)
        assert done.rc == 0 and said in done.stdout, (done.stdout, done.stderr)
    off = {"worker": "lora", "mem_gib": 2, "configs": ["c1"], "share_base": "off"}
    write_suite(tmp_path / "plans", "o", off, CONFIG)
    done = orch_inproc("submit", "--plans", plans, "--suite", "o", "--pairs", "1:glue_rte", "--dry-run")
    assert done.rc == 0 and "share_base" not in done.stdout
