"""`share_base: fused`, the daemon's side, from values: placement of a group as one unit, the
group OOM's classification and what the job does next, the suite's lowered cap, one process's
failures counted once, the group-size memory rule and share.json read as untrusted input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.attempts.classify import classify_attempt, group_oom_members
from orchestrator.attempts.fused_lessons import group_shape_key, group_size
from orchestrator.attempts.next_step import (
    EndEvidence,
    EndVerdict,
    classify_end,
    decide_next,
    fused_cap_after,
)
from orchestrator.attempts.share_record import parse_share, read_share
from orchestrator.lifecycle import AttemptOutcome, JobState
from orchestrator.prediction.fused_groups import fuse_group, fuse_max
from orchestrator.scheduling.packing.pack import pack
from orchestrator.scheduling.packing.types import PackingPolicy, QueuedJob, RunningAttempt
from orchestrator.store.endings import GROUP_DEATH_WINDOW_S, Failure, once_per_process
from orchestrator.store.sharing import shares_label
from tests.test_packing import GIB, NO_HEADROOM, gpu, job, placed

GROUP = "g"
LINE = "orch: fused group of 4 members ran out of memory"


def member(job_id: int, gpu_index: int, base_gib: float | None, cap: int = 4, predicted_gib: float = 10,
           group: str = GROUP) -> RunningAttempt:
    return RunningAttempt(job_id, gpu_index, int(predicted_gib * GIB), int(predicted_gib * GIB), True,
                          fuse_group=group, fuse_cap=cap, base_mib=None if base_gib is None else int(base_gib * GIB))


def fused_job(job_id: int, need_gib: float, cap: int = 4, group: str = GROUP) -> QueuedJob:
    return job(job_id, need_gib, fuse_group=group, fuse_cap=cap)


# ------------------------------------------------------------------ placement


def test_a_member_joins_the_card_where_its_group_runs_for_its_own_need_and_no_slot() -> None:
    # card 0: one plan slot, taken by a member of the group whose base holds 8 GiB; 4 GiB free
    cards = [gpu(0, 24, free_gib=4, slots=1), gpu(1, 24, slots=1)]
    d = pack([fused_job(1, 10)], cards, [member(9, 0, base_gib=8)], NO_HEADROOM, 0.0)
    assert placed(d) == {1: 0}  # joins (10 - 8 = 2 GiB) although card 1 is empty
    assert d.placements[0].reserved_mib == 2 * GIB
    solo = pack([job(1, 10)], cards, [member(9, 0, base_gib=8)], NO_HEADROOM, 0.0)
    assert placed(solo) == {1: 1}  # the same job outside the group: a card of its own


def test_without_the_base_figure_a_member_is_placed_by_its_full_prediction() -> None:
    cards = [gpu(0, 24, free_gib=4, slots=1)]
    d = pack([fused_job(1, 10)], cards, [member(9, 0, base_gib=None)], NO_HEADROOM, 0.0)
    assert placed(d) == {}  # never below what is known: 10 GiB does not fit in 4
    roomy = pack([fused_job(1, 10)], [gpu(0, 24, free_gib=12, slots=1)], [member(9, 0, None)], NO_HEADROOM, 0.0)
    assert placed(roomy) == {1: 0} and roomy.placements[0].reserved_mib == 10 * GIB  # joins, no slot needed


def test_a_full_group_takes_no_more_members_a_new_process_needs_a_slot() -> None:
    running = [member(i, 0, base_gib=8, cap=2) for i in (8, 9)]  # cap 2, two members: full
    d = pack([fused_job(1, 10, cap=2)], [gpu(0, 48, free_gib=30, slots=1)], running, NO_HEADROOM, 0.0)
    assert placed(d) == {}  # a second process would need a second plan slot
    d2 = pack([fused_job(1, 10, cap=2)], [gpu(0, 48, free_gib=30, slots=2)], running, NO_HEADROOM, 0.0)
    assert placed(d2) == {1: 0} and d2.placements[0].reserved_mib == 10 * GIB  # whole base again


def test_members_placed_in_one_pass_fill_the_group_up_to_its_cap() -> None:
    queue = [fused_job(i, 6, cap=3) for i in range(1, 6)]
    d = pack(queue, [gpu(0, 80, slots=1), gpu(1, 80, slots=1)], [], NO_HEADROOM, 0.0)
    on = placed(d)
    assert sorted(on.values()).count(0) == 3 and sorted(on.values()).count(1) == 2  # 3 + 2: one process each


def test_after_the_cap_is_lowered_a_process_started_under_the_old_one_takes_no_new_member() -> None:
    # three members started under cap 4; a group OOM elsewhere lowered the suite's cap to 2: the
    # warm process takes a job only while it has fewer members than every member's cap and the
    # joiner's, so the job starts another process: a plan slot and its whole prediction
    running = [member(i, 0, base_gib=8, cap=4) for i in (7, 8, 9)]
    one_slot = pack([fused_job(1, 10, cap=2)], [gpu(0, 80, free_gib=40, slots=1)], running, NO_HEADROOM, 0.0)
    assert placed(one_slot) == {}  # counted as joining, it would have taken 2 GiB and no slot
    two_slots = pack([fused_job(1, 10, cap=2)], [gpu(0, 80, free_gib=40, slots=2)], running, NO_HEADROOM, 0.0)
    assert placed(two_slots) == {1: 0} and two_slots.placements[0].reserved_mib == 10 * GIB
    # under the old cap the same process still has room
    joins = pack([fused_job(1, 10, cap=4)], [gpu(0, 80, free_gib=40, slots=1)], running, NO_HEADROOM, 0.0)
    assert placed(joins) == {1: 0} and joins.placements[0].reserved_mib == 2 * GIB


def test_another_group_or_a_cap_of_one_never_joins() -> None:
    cards = [gpu(0, 24, free_gib=4, slots=1)]
    assert placed(pack([fused_job(1, 10, group="other")], cards, [member(9, 0, 8)], NO_HEADROOM, 0.0)) == {}
    at_one = [member(9, 0, 8, cap=1)]
    assert placed(pack([fused_job(1, 10, cap=1)], cards, at_one, NO_HEADROOM, 0.0)) == {}


def test_running_members_of_one_group_take_one_slot() -> None:
    running = [member(i, 0, base_gib=8) for i in (7, 8, 9)]  # one process, 3 of 4
    d = pack([job(1, 2)], [gpu(0, 80, slots=2)], running, PackingPolicy(), 0.0)
    assert placed(d) == {1: 0}  # the other plan slot is still free


def test_the_group_key_follows_the_resolved_config() -> None:
    base = {"model": "m", "prec": "bf16", "max_seq_len": 256, "learning_rate": 1e-4}
    a = _job({"share_base": "fused"}, base)
    b = _job({"share_base": "fused"}, {**base, "learning_rate": 3e-4, "peft": {"r": 16}})
    assert fuse_group(a, "s", {}) == fuse_group(b, "s", {}) is not None  # other LoRA settings: one group
    assert fuse_group(a, "s", {}) != fuse_group(a, "t", {})  # another suite
    assert fuse_group(a, "s", {"gradient_checkpointing": True}) != fuse_group(a, "s", {})  # a ladder rung
    assert fuse_group(a, "s", {}, run_alone=True) is None
    assert fuse_group(_job({"share_base": "sequential"}, base), "s", {}) is None
    assert fuse_group(_job({"share_base": "fused"}, base, gpus=2), "s", {}) is None
    assert fuse_max(a, None) == 4 and fuse_max(a, 2) == 2 and fuse_max(a, 1) == 1
    assert fuse_max(_job({"share_base": "fused", "fused_members": 8}, base), 5) == 5


def _job(worker_output: dict[str, Any], config: dict[str, Any], gpus: int = 1) -> Any:
    return SimpleNamespace(worker="lora", worker_output=worker_output, config=config, gpus=gpus)


# ------------------------------------------------------------------ a group's OOM


def test_the_group_oom_line_with_exit_75_is_its_own_outcome_before_the_cuda_signatures() -> None:
    tail = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n" + LINE + "\n"
    verdict = classify_attempt(exit_code=75, signal=None, result=None, log_tail=tail, fused=True)
    assert verdict.outcome is AttemptOutcome.GROUP_OOM and verdict.group_members == 4
    failed_result = {"status": "oom", "error": "CUDA out of memory"}
    assert classify_attempt(exit_code=75, signal=None, result=failed_result, log_tail=tail,
                            fused=True).outcome \
        is AttemptOutcome.GROUP_OOM


def test_only_a_fused_job_may_end_as_its_groups_oom() -> None:
    # any other job's worker that exits 75 and prints the line is read as before: never requeued
    # uncounted for ever, never lowering a suite's cap
    tail = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n" + LINE + "\n"
    own = classify_attempt(exit_code=75, signal=None, result=None, log_tail=tail)
    assert own.outcome is AttemptOutcome.OOM and own.group_members is None
    assert classify_attempt(exit_code=75, signal=None, result=None, log_tail=LINE).outcome is AttemptOutcome.FAILED
    evidence = {"exit_record": {"exit_code": 75, "signal": None}, "result": None, "log_tail": LINE,
                "kill_reason": None}
    assert classify_end(EndEvidence(**evidence)).classification.outcome is AttemptOutcome.FAILED
    assert classify_end(EndEvidence(**evidence, fused=True)).classification.outcome is AttemptOutcome.GROUP_OOM


@pytest.mark.parametrize(
    ("exit_code", "tail"),
    [(1, LINE), (3, LINE), (75, "some text " + LINE), (75, LINE + " or so"), (75, "orch: fused group of 1 members "
     "ran out of memory"), (75, "orch: fused group of 99 members ran out of memory"), (75, "")],
)
def test_only_the_exact_line_with_exit_75_is_a_group_oom(exit_code: int, tail: str) -> None:
    assert group_oom_members(exit_code, tail) is None
    verdict = classify_attempt(exit_code=exit_code, signal=None, result=None, log_tail=tail, fused=True)
    assert verdict.outcome is not AttemptOutcome.GROUP_OOM


def test_a_group_oom_is_requeued_uncounted_at_its_level_and_halves_the_cap() -> None:
    from tests.test_next_step import LEVELS, a_job

    job_row = a_job(level=1, attempt_count=2, max_attempts=2)  # its last counted attempt
    verdict = EndVerdict(classify_attempt(exit_code=75, signal=None, result=None, log_tail=LINE, fused=True))
    step = decide_next(job_row, LEVELS, LEVELS[1], verdict)
    assert step.job_state is JobState.QUEUED and not step.counted and step.next_level is None
    assert step.job_fields["max_attempts"] == 3 and "level" not in step.job_fields
    assert "at most 2 members" in step.why
    assert [fused_cap_after(n) for n in (2, 3, 4, 16, None)] == [1, 1, 2, 8, 1]
    # bounded: past the halvings from 16 to 1, a job's group OOM is taken as its own (down the ladder)
    fifth = decide_next(job_row, LEVELS, LEVELS[1], verdict, group_ooms_so_far=4)
    assert fifth.counted and fifth.job_state is JobState.FAILED  # its last counted attempt
    roomy = decide_next(a_job(level=1, attempt_count=1), LEVELS, LEVELS[1], verdict, group_ooms_so_far=4)
    assert roomy.counted and roomy.next_level == 2


# ------------------------------------------------------------------ crash loop, memory, share.json


def test_one_fused_processes_death_counts_once() -> None:
    fused = [Failure(2.0, 100.0, "fused", "ab12-0", 100), Failure(2.1, 100.5, "fused", "ab12-0", 100),
             Failure(2.2, 101.0, "fused", "ab12-0", 100), Failure(3.0, 101.0, None, None, None),
             Failure(1.0, 102.0, "fused", "ab12-0", 101), Failure(1.5, 103.0, None, None, None)]
    assert once_per_process(fused) == [2.0, 3.0, 1.0, 1.5]  # members failing together: once


def test_a_sequential_processes_failures_and_a_fused_ones_apart_each_count() -> None:
    # one sequential warm process trains jobs one after another under one pid: each failure is a crash
    sequential = [Failure(1.0 + n, 100.0 + n, "sequential", "ab12-0", 100) for n in range(4)]
    assert once_per_process(sequential) == [1.0, 2.0, 3.0, 4.0]
    # fused failures of one pid minutes apart are crashes of their own
    apart = [Failure(1.0, 100.0, "fused", "ab12-0", 100), Failure(1.1, 100.0 + GROUP_DEATH_WINDOW_S + 1,
             "fused", "ab12-0", 100), Failure(1.2, 400.0, "fused", "ab12-0", 100),
             Failure(1.3, 405.0, "fused", "ab12-0", 100)]
    assert once_per_process(apart) == [1.0, 1.1, 1.2]  # the fourth died with the third


def test_a_groups_peak_teaches_its_group_size_never_the_solo_shape() -> None:
    assert group_size({"fused_members_max": 3}, seen_members=1) == 3  # the worker's word first
    assert group_size({}, seen_members=2) == 2 and group_size(None, None) == 1
    assert group_size({"fused_members_max": "3"}, seen_members=5) == 5  # junk: the daemon's count
    assert group_size({"fused_members_max": 99}, seen_members=None) == 1
    assert group_shape_key("shape", 1) == "shape" and group_shape_key("shape", 3) == "shape|fused3"


def test_share_json_is_read_as_untrusted_input(tmp_path: Path) -> None:
    good = {"mode": "fused", "process": "0123456789abcdef-0", "pid": 4242, "base_mem_mib": 8000}
    record = parse_share(json.dumps(good).encode())
    assert record is not None and (record.mode, record.process, record.pid, record.base_mib) == \
        ("fused", "0123456789abcdef-0", 4242, 8000)
    junk_base = parse_share(json.dumps({**good, "base_mem_mib": "8000"}).encode())
    assert junk_base is not None and junk_base.base_mib is None  # the rest still names the process
    for bad in ({**good, "mode": "parallel"}, {**good, "pid": True}, {**good, "pid": 0},
                {**good, "process": "../../etc"}, {**good, "process": "x" * 100}, [good]):
        assert parse_share(json.dumps(bad).encode()) is None
    assert parse_share(b"\xff\xfe") is None and parse_share(b"{" * 5000) is None and parse_share(None) is None
    run_dir = tmp_path / "runs" / "s" / "000001-c-s1" / "attempt-1"
    run_dir.mkdir(parents=True)
    assert read_share(run_dir) is None  # none written
    (run_dir / "share.json").write_text(json.dumps(good) + " " * 5000)  # over the size cap
    assert read_share(run_dir) is None
    (run_dir / "share.json").write_text(json.dumps(good))
    assert read_share(run_dir) == record
    (run_dir / "share.json").unlink()
    (run_dir / "share.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps(good))
    assert read_share(run_dir) is None  # a link is not followed
    assert shares_label("fused", "0123456789abcdef-0", [5, 3, 4]) == "fused 0123-0 · jobs 3,4,5"
    assert shares_label("sequential", "ab12-1", [3]) == "warm ab12-1" and shares_label(None, None, []) == ""


def test_a_card_whose_slots_are_taken_is_open_while_its_group_has_room() -> None:
    from orchestrator.scheduling.packing.pack import can_take_any, open_slots

    full = [gpu(0, 80, slots=1)]
    one = [member(9, 0, base_gib=8, cap=3)]
    assert can_take_any(full, one, NO_HEADROOM) and open_slots(full, one, NO_HEADROOM) == 2  # 2 more members
    solo = [RunningAttempt(9, 0, 10 * GIB, 10 * GIB, True)]
    assert not can_take_any(full, solo, NO_HEADROOM) and open_slots(full, solo, NO_HEADROOM) == 0
    at_cap = [member(i, 0, base_gib=8, cap=3) for i in (7, 8, 9)]
    assert not can_take_any(full, at_cap, NO_HEADROOM)


def test_a_member_joins_its_group_while_the_family_still_probes() -> None:
    probing = [replace(member(9, 0, base_gib=None), probe_family="fam")]
    d = pack([replace(fused_job(1, 4), probe_family="fam")], [gpu(0, 80, slots=1)], probing, NO_HEADROOM, 0.0)
    assert placed(d) == {1: 0}  # at its whole prediction (no base figure yet)
    alone = pack([job(1, 4, probe_family="fam")], [gpu(0, 80, slots=2)], probing, NO_HEADROOM, 0.0)
    assert placed(alone) == {}  # any other job of the family waits for the probe
