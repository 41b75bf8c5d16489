"""`share_base: fused` placement by the memory learned per group size: a fused process is placed
by its members' `<shape>|fused<k>` records where they exist (the pure packer, then the daemon's
pass over state.db), else as before (its base and its members' own needs)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.prediction.fused_groups import GroupPeak, group_shape_key, learned_group_peaks
from orchestrator.scheduling.packing.fused import process_peak
from orchestrator.scheduling.packing.pack import pack
from orchestrator.scheduling.packing.types import PackingPolicy, QueuedJob, RunningAttempt
from orchestrator.store.rows import ShapeMemory
from tests.test_packing import GIB, NO_HEADROOM, gpu, job, placed

GROUP = "g"


def peaks(*at: tuple[int, float, bool]) -> tuple[GroupPeak, ...]:
    """(members, GiB, measured) per group size."""
    return tuple(GroupPeak(k, int(gib * GIB), measured) for k, gib, measured in at)


def fused_job(job_id: int, need_gib: float, learned: tuple[GroupPeak, ...] = (), cap: int = 4) -> QueuedJob:
    return job(job_id, need_gib, fuse_group=GROUP, fuse_cap=cap, group_peaks=learned)


def member(job_id: int, placed_gib: float, learned: tuple[GroupPeak, ...] = (), base_gib: float | None = None,
           cap: int = 4, process_gib: float | None = None, stepped: bool = True,
           opened: bool = True) -> RunningAttempt:
    """A running member placed at `placed_gib`; `process_gib`: what its warm process holds on the
    card as the snapshot read it; `stepped`: it reached its peak (the card reserves nothing more);
    `opened`: placed with the base (it opened its process), else joined for its own needs."""
    return RunningAttempt(job_id, 0, int(placed_gib * GIB), 0, stepped, fuse_group=GROUP, fuse_cap=cap,
                          base_mib=None if base_gib is None else int(base_gib * GIB), group_peaks=learned,
                          process_mib=None if process_gib is None else int(process_gib * GIB),
                          opened_process=opened)


def reserved(decision: object) -> dict[int, int]:
    return {p.job_id: p.reserved_mib for p in decision.placements}  # type: ignore[attr-defined]


# ------------------------------------------------------------------ the records as process peaks


def test_a_group_sizes_record_is_read_with_the_solo_paths_margin_and_floor() -> None:
    shape = "h|m|t"
    shapes = {
        shape: ShapeMemory(5000, None, 1),  # its own record (alone in its process): never a group's
        group_shape_key(shape, 2): ShapeMemory(8000, None, 1),
        group_shape_key(shape, 3): ShapeMemory(None, 9000, 0),  # an OOM floor only
        group_shape_key(shape, 4): ShapeMemory(10000, 12000, 4),  # measured, floor above it
        group_shape_key("other|m|t", 2): ShapeMemory(1, None, 1),
    }
    assert learned_group_peaks(shape, shapes) == (
        GroupPeak(2, 8400, True),  # 5 % over one measured peak
        GroupPeak(3, 9450, False),  # the floor's margin: raises, never lowers
        GroupPeak(4, 12300, False),  # 2.5 % over four; the floor outbids the peak
    )
    assert learned_group_peaks("nothing|m|t", shapes) == ()


def test_the_process_peak_is_the_largest_members_record_measured_only_where_all_were() -> None:
    a, b = peaks((2, 10, True), (3, 12, True)), peaks((2, 11, True))
    assert process_peak([a, a], 2) == GroupPeak(2, 10 * GIB, True)
    assert process_peak([a, b], 2) == GroupPeak(2, 11 * GIB, True)
    assert process_peak([a, b, b], 3) == GroupPeak(3, 12 * GIB, False)  # b's shape has no record of 3
    assert process_peak([b, b], 4) is None


# ------------------------------------------------------------------ placement


def test_a_group_that_fits_by_its_members_needs_waits_when_its_record_at_that_size_says_it_does_not() -> None:
    # the base (8 GiB) is known: each joiner needs 10 - 8 = 2 GiB, 3 × 2 fit in the 7 GiB left
    running = [member(9, 10, base_gib=8)]
    card = [gpu(0, 24, free_gib=7, slots=1)]
    queue = [fused_job(i, 10) for i in (1, 2, 3)]
    assert placed(pack(queue, card, running, NO_HEADROOM, 0.0)) == {1: 0, 2: 0, 3: 0}
    # measured: a process of this shape peaked at 19 GiB with 4 members, not 10 + 3 × 2 = 16
    learned = peaks((4, 19, True))
    queue = [fused_job(i, 10, learned) for i in (1, 2, 3)]
    d = pack(queue, card, [member(9, 10, learned, base_gib=8, process_gib=10)], NO_HEADROOM, 0.0)
    assert reserved(d) == {1: 2 * GIB, 2: 2 * GIB}  # sizes 2 and 3 have no record: as before
    # the process at 4 members: 19 GiB less the 14 it is counted at (the 10 it holds, 2 × 2
    # reserved); 3 are left
    assert d.wait_reasons[3] == ("GPU 0: 3.0 GiB free (4.0 GiB reserved for ramping jobs), "
                                 "needs 5.0 GiB + 0.0 GiB headroom")


def test_before_any_share_json_a_joiner_is_placed_for_its_prediction_less_the_estimated_base() -> None:
    # a sweep's first pass: no member runs, so no share.json says what the base holds; the
    # estimate's weights and context (3 GiB) are the process's, placed with the member that opens it
    first = [job(i, 10, fuse_group=GROUP, fuse_cap=4, estimated_base_mib=3 * GIB) for i in (1, 2, 3, 4, 5)]
    d = pack(first, [gpu(0, 80, slots=2)], [], NO_HEADROOM, 0.0)
    assert reserved(d) == {1: 10 * GIB, 2: 7 * GIB, 3: 7 * GIB, 4: 7 * GIB, 5: 10 * GIB}  # 5 opens another
    # a member's share.json figure wins over the estimate's
    running = [member(9, 10, base_gib=2)]
    d = pack([job(1, 10, fuse_group=GROUP, fuse_cap=4, estimated_base_mib=3 * GIB)], [gpu(0, 80, slots=2)],
             running, NO_HEADROOM, 0.0)
    assert reserved(d) == {1: 8 * GIB}
    # without either, its whole prediction
    d = pack([fused_job(1, 10), fused_job(2, 10)], [gpu(0, 80, slots=2)], [], NO_HEADROOM, 0.0)
    assert reserved(d) == {1: 10 * GIB, 2: 10 * GIB}
    # a prediction near the estimated base (a declared 4 GiB for a 3.5 GiB base): a quarter of it
    low = [job(i, 4, fuse_group=GROUP, fuse_cap=4, estimated_base_mib=int(3.5 * GIB)) for i in (1, 2)]
    assert reserved(pack(low, [gpu(0, 80, slots=2)], [], NO_HEADROOM, 0.0)) == {1: 4 * GIB, 2: GIB}


def test_a_group_that_does_not_fit_by_its_members_predictions_joins_where_its_record_says_it_fits() -> None:
    # no base figure: each joiner is placed by its whole prediction, 10 GiB, and 7 are free
    card = [gpu(0, 24, free_gib=7, slots=1)]
    assert placed(pack([fused_job(1, 10)], card, [member(9, 10)], NO_HEADROOM, 0.0)) == {}
    learned = peaks((2, 13, True), (3, 15.5, True))
    running = [member(9, 10, learned, process_gib=10)]  # its process holds 10 GiB
    d = pack([fused_job(i, 10, learned) for i in (1, 2)], card, running, NO_HEADROOM, 0.0)
    assert reserved(d) == {1: 3 * GIB, 2: int(2.5 * GIB)}  # 13 - 10, then 15.5 - 13


def test_placed_in_one_pass_the_process_is_counted_at_its_record_at_each_size() -> None:
    learned = peaks((2, 14, True), (3, 17, True), (4, 19, True))
    d = pack([fused_job(i, 10, learned) for i in (1, 2, 3, 4)], [gpu(0, 24, slots=1)], [], NO_HEADROOM, 0.0)
    assert reserved(d) == {1: 10 * GIB, 2: 4 * GIB, 3: 3 * GIB, 4: 2 * GIB}  # 10, 14, 17, 19 in all
    small = [gpu(0, 18, slots=1)]
    assert placed(pack([fused_job(i, 10, learned) for i in (1, 2, 3, 4)], small, [], NO_HEADROOM, 0.0)) == {
        1: 0, 2: 0, 3: 0}  # 17 GiB at three members; the fourth would make it 19


def test_a_record_only_raises_while_not_every_members_shape_was_measured_at_that_size() -> None:
    card = [gpu(0, 24, free_gib=7, slots=1)]
    floor = peaks((2, 12, False))  # an OOM floor at two members: the whole prediction stays
    assert placed(pack([fused_job(1, 10, floor)], card, [member(9, 10, floor)], NO_HEADROOM, 0.0)) == {}
    raised = pack([fused_job(1, 10, peaks((2, 19, False)))], card, [member(9, 10, base_gib=8)], NO_HEADROOM, 0.0)
    assert placed(raised) == {}  # 19 - 10 = 9 GiB, above the 2 of its own needs and the 7 free
    # the joiner's shape was measured at two, the running member's was not: no lowering
    measured = peaks((2, 13, True))
    assert placed(pack([fused_job(1, 10, measured)], card, [member(9, 10)], NO_HEADROOM, 0.0)) == {}
    d = pack([fused_job(1, 10, measured)], card, [member(9, 10, peaks((2, 12, True)), process_gib=10)],
             NO_HEADROOM, 0.0)
    assert reserved(d) == {1: 3 * GIB}  # both measured: the larger record, 13 GiB, less the 10 held


def test_a_joiner_is_placed_against_what_the_card_counts_of_the_process_not_its_placement() -> None:
    # placed at a declared 20 GiB, the process holds 10 once it stepped: the card counts it at 10,
    # so a joiner brings it to its measured peak at two members, 14, by 4 (not 14 - 20 -> 0)
    learned = peaks((2, 14, True))
    card = [gpu(0, 24, free_gib=14, slots=1)]
    joiner = [fused_job(1, 20, learned)]
    assert reserved(pack(joiner, card, [member(9, 20, learned, process_gib=10)], NO_HEADROOM, 0.0)) == {1: 4 * GIB}
    # no reading: the base it reported is the least the process holds; neither: nothing
    assert reserved(pack(joiner, card, [member(9, 20, learned, base_gib=8)], NO_HEADROOM, 0.0)) == {1: 6 * GIB}
    assert reserved(pack(joiner, card, [member(9, 20, learned)], NO_HEADROOM, 0.0)) == {1: 14 * GIB}
    # still ramping up, the card reserves its placement: that is what it counts
    ramping = [member(9, 20, learned, stepped=False)]
    assert reserved(pack(joiner, [gpu(0, 24, slots=1)], ramping, NO_HEADROOM, 0.0)) == {1: 0}


def test_a_process_is_never_counted_above_what_its_members_were_placed_at() -> None:
    # the reading says 17 GiB (a process of more members than the one counted here, or one above
    # its prediction): the joiner is placed against the 10 its member was placed at, not 17
    learned = peaks((2, 14, True))
    d = pack([fused_job(1, 10, learned)], [gpu(0, 40, slots=1)], [member(9, 10, learned, process_gib=17)],
             NO_HEADROOM, 0.0)
    assert reserved(d) == {1: 4 * GIB}


def test_a_joiner_leaves_no_room_another_job_would_take_from_the_process() -> None:
    # 13 GiB free; the process holds 10 and is measured at 14 with two members: a joiner takes 4,
    # and a 10 GiB job of another suite no longer fits beside it (the card would need 14)
    learned = peaks((2, 14, True))
    queue = [fused_job(1, 20, learned), job(2, 10)]
    d = pack(queue, [gpu(0, 24, free_gib=13, slots=2)], [member(9, 20, learned, process_gib=10)],
             NO_HEADROOM, 0.0)
    assert reserved(d) == {1: 4 * GIB}
    assert d.wait_reasons[2].startswith("GPU 0: 9.0 GiB free (4.0 GiB reserved for ramping jobs), needs 10.0 GiB")


def test_a_record_never_counts_where_the_job_opens_a_process() -> None:
    learned = peaks((2, 4, True), (3, 12, True))  # smaller than the job alone: the group's, not the job's
    # one process at its cap (it holds 11 GiB; its base is 8): joined, the job would take 12 - 11 = 1
    # GiB by its record at three, or 10 - 8 = 2 by its own needs
    full = [member(8, 10, learned, base_gib=8, cap=2, process_gib=11), member(9, 1, learned, cap=2, process_gib=11)]
    d = pack([fused_job(1, 10, learned, cap=2)], [gpu(0, 24, slots=2)], full, NO_HEADROOM, 0.0)
    assert reserved(d) == {1: 10 * GIB}  # a new process: its whole prediction


# ------------------------------------------------------------------ the daemon's pass


def _fused_suite(plans: Path, declared_gib: int) -> None:
    (plans / "configs" / "fz").mkdir(parents=True)
    (plans / "suites").mkdir(parents=True)
    (plans / "configs" / "fz" / "c1.yaml").write_text(yaml.safe_dump({"model": "tiny-llama", "batch_size": 2}))
    (plans / "suites" / "fz.yaml").write_text(yaml.safe_dump({
        "worker": "lora", "mem_gib": declared_gib, "configs": ["c1"], "share_base": "fused", "fused_members": 4}))


class _DaemonPasses:
    """The fused suite `fz` (one config, `declared_gib` each) on a fresh state.db under `root`, a
    plan of one slot per card: `submit` queues pairs, `scheduling_pass` runs one pass."""

    def __init__(self, root: Path, declared_gib: int) -> None:
        from orchestrator.plans import GpuPlan, load_suite
        from orchestrator.scheduling.dispatch import DispatchContext
        from orchestrator.scheduling.state import SchedulerState
        from orchestrator.store import Store
        from orchestrator.store.jobs import set_gpu_plan

        _fused_suite(root / "plans", declared_gib)
        self.suite = load_suite("fz", root / "plans")
        self.store = Store(root / "state.db")
        set_gpu_plan(self.store, GpuPlan(slots_by_gpu={}, default_slots=1))
        self.ctx = DispatchContext(root / "runs", PackingPolicy(order="fifo"), {})
        self.state = SchedulerState()

    def submit(self, pairs: str) -> None:
        from orchestrator.plans import expand_jobs, parse_pairs
        from orchestrator.store.jobs import submit_jobs

        submit_jobs(self.store, self.suite, expand_jobs(self.suite, parse_pairs(pairs), {}, None, 0),
                    allowed_gpus=None, priority=0, force=False, dry_run=False)  # fmt: skip

    def scheduling_pass(self, card: tuple[GpuSnapshot, ...]) -> list[Any]:
        """The attempts one scheduling pass started."""
        from orchestrator.scheduling.dispatch import schedule
        from orchestrator.store.sweep_attempts import all_attempts
        from tests.test_scale import _Recorder

        seen = {a.id for a in all_attempts(self.store)}
        schedule(self.store, card, _Recorder(), self.ctx, self.state, draining=False)
        return [a for a in all_attempts(self.store) if a.id not in seen]

    def first_shape(self) -> str:
        """The memory shape of the first job's level 0."""
        from orchestrator.prediction.job_facts import JobShapeCache, job_levels, job_shape_key
        from tests.store_reads import read_jobs

        first = read_jobs(self.store)[0]
        return job_shape_key(first, job_levels(first, JobShapeCache())[0])


def test_the_daemons_pass_places_a_group_by_its_learned_peak_per_group_size(tmp_path: Path) -> None:
    from orchestrator.store.attempts import write_shape

    def run(learned: bool) -> list[tuple[int, int]]:
        """Two passes over one 24 GiB card of one plan slot: one job queued, then three more;
        (pass, reserved MiB) of each attempt started."""
        passes = _DaemonPasses(tmp_path / ("learned" if learned else "not"), declared_gib=10)
        card = (GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=24 * GIB, used_mib=0,
                            free_mib=24 * GIB, processes=()),)  # fmt: skip
        started: list[tuple[int, int]] = []
        for n, pairs in enumerate(("1:toy", "2:toy 3:toy 4:toy")):
            passes.submit(pairs)
            if learned and n == 0:
                shape = passes.first_shape()
                for k, gib in ((2, 12), (3, 13.5)):  # seeds of one config: one shape, measured at 2 and 3
                    write_shape(passes.store, group_shape_key(shape, k), ShapeMemory(int(gib * GIB), None, 1))
            started += [(n, a.reserved_mib) for a in passes.scheduling_pass(card)]
        passes.store.close()
        return started

    # declared 10 GiB each, no base figure: the second fits beside the first (10 + 10 + 2.4 GiB
    # headroom), the third does not
    assert run(learned=False) == [(0, 10 * GIB), (1, 10 * GIB)]
    # learned: the process of the running member (its record read from state.db) and two joiners
    # peaks at 12 × 1.05 and 13.5 × 1.05 GiB; a fourth member has no record (its whole 10 GiB)
    at_2, at_3 = math.ceil(12 * GIB * 1.05), math.ceil(13.5 * GIB * 1.05)
    assert run(learned=True) == [(0, 10 * GIB), (1, at_2 - 10 * GIB), (1, at_3 - at_2)]


def test_orch_memory_names_a_group_sizes_record_and_its_size(tmp_path: Path) -> None:
    from orchestrator.cli.memory import memory_snapshot, render
    from orchestrator.prediction.fused_groups import split_group_key
    from orchestrator.store import Store
    from orchestrator.store.attempts import write_shape

    shape = "0123456789abcdef|tiny-llama|toy"
    assert split_group_key(group_shape_key(shape, 4)) == (shape, 4)
    assert split_group_key(shape) == (shape, None)
    assert split_group_key(f"{shape}|fused1") == (f"{shape}|fused1", None)  # no group of one is recorded
    # a shape whose task is named like a group size is a shape of its own; sizes as the daemon
    # writes them only (the keys come back from the store)
    for own in ("0123456789abcdef|tiny-llama|fused4", f"{shape}|fused04", f"{shape}|fused\u0664",
                f"{shape}|fused\u00b2", f"{shape}|fused17"):
        assert split_group_key(own) == (own, None)
    assert split_group_key("0123456789abcdef|tiny-llama|fused4|fused2") == ("0123456789abcdef|tiny-llama|fused4", 2)
    with Store(tmp_path / "state.db") as store:
        write_shape(store, shape, ShapeMemory(5 * GIB, None, 1))
        write_shape(store, group_shape_key(shape, 4), ShapeMemory(19 * GIB, None, 2))
        entries, _ = memory_snapshot(store)
    assert [(e["shape"], e["fused_members"]) for e in entries] == [(shape, None), (f"{shape}|fused4", 4)]
    lines = render(entries).splitlines()
    assert lines[1].startswith(f"{shape} ") and " 5.0 GiB " in lines[1]
    assert lines[2].startswith(f"{shape}, fused ×4 ") and " 19.0 GiB " in lines[2]


def test_the_daemons_pass_counts_a_stepped_process_at_what_its_card_shows_it_holds(tmp_path: Path) -> None:
    from orchestrator.attempts.share_record import ShareRecord
    from orchestrator.gpu.snapshot import ProcessMemory
    from orchestrator.store.attempts import update_attempt, write_shape

    pid = 4242

    def joiner_reserves(process_seen: bool) -> list[int]:
        """The first member, placed at its declared 20 GiB, stepped in a warm process of pid 4242
        that holds 10 GiB (its share.json: base 8 GiB); the MiB a second job reserves to join it."""
        passes = _DaemonPasses(tmp_path / ("seen" if process_seen else "unseen"), declared_gib=20)
        processes = (ProcessMemory(pid, 10 * GIB),) if process_seen else ()
        card = (GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=40 * GIB, used_mib=10 * GIB,
                            free_mib=30 * GIB, processes=processes),)
        reserves: list[int] = []
        for n, pairs in enumerate(("1:toy", "2:toy")):
            passes.submit(pairs)
            started = passes.scheduling_pass(card)
            reserves += [a.reserved_mib for a in started]
            if n == 0:
                write_shape(passes.store, group_shape_key(passes.first_shape(), 2), ShapeMemory(12 * GIB, None, 1))
                [attempt] = started
                update_attempt(passes.store, attempt.id, reached_peak=1,
                               **ShareRecord("fused", "0123456789abcdef-0", pid, 8 * GIB).fields())
        passes.store.close()
        return reserves

    at_2 = math.ceil(12 * GIB * 1.05)  # the process's measured peak at two members, with its margin
    # the card counts the stepped process at what it holds (10 GiB), not at its 20 GiB placement
    assert joiner_reserves(process_seen=True) == [20 * GIB, at_2 - 10 * GIB]
    # the process not read: its base (8 GiB, share.json) is the least it holds
    assert joiner_reserves(process_seen=False) == [20 * GIB, at_2 - 8 * GIB]


def test_when_the_member_that_opened_the_process_has_ended_the_base_is_not_counted_twice() -> None:
    # the process (base 8 GiB, now holding 10) outlived the member that opened it; the one left
    # joined it, placed at 2 GiB for its own needs: the process is counted at 10 GiB, not at 2
    left = member(9, 2, peaks((2, 13, True)), base_gib=8, process_gib=10, opened=False)
    d = pack([fused_job(1, 10, peaks((2, 13, True)))], [gpu(0, 24, free_gib=5, slots=1)], [left], NO_HEADROOM, 0.0)
    assert reserved(d) == {1: 3 * GIB}  # 13 - 10: the base the process holds is counted once


def test_a_placement_names_the_process_it_was_counted_in() -> None:
    from dataclasses import replace

    from orchestrator.scheduling.packing.fused import ProcessChoice

    def processes(decision: object) -> dict[int, ProcessChoice | None]:
        return {p.job_id: p.process for p in decision.placements}  # type: ignore[attr-defined]

    card = [gpu(0, 80, slots=4)]
    # placed in one call: the first opens, the next joins it by its job, the third opens another
    d = pack([fused_job(i, 4, cap=2) for i in (1, 2, 3)], card, [], NO_HEADROOM, 0.0)
    assert processes(d) == {1: ProcessChoice(True), 2: ProcessChoice(False, None, 1), 3: ProcessChoice(True)}
    # running members carry their process's name: a joiner joins the last one by that name
    running = [replace(member(9, 4, cap=4), fuse_process=30), replace(member(8, 4, cap=4, opened=False),
                                                                      fuse_process=30)]
    d = pack([fused_job(1, 4)], card, running, NO_HEADROOM, 0.0)
    assert processes(d) == {1: ProcessChoice(False, 30, None)}
    assert d.placements[0].reserved_mib == 4 * GIB  # no base figure: its whole prediction
    # two running members of other names are two processes, though the first had room: two slots
    running = [replace(member(9, 4), fuse_process=30), replace(member(8, 4), fuse_process=31)]
    one_slot_left = [gpu(0, 80, slots=3)]
    d = pack([fused_job(1, 4), job(2, 4)], one_slot_left, running, NO_HEADROOM, 0.0)
    assert processes(d) == {1: ProcessChoice(False, 31, None), 2: None}  # job 2 takes the last slot
    d = pack([job(2, 4), job(3, 4)], one_slot_left, running, NO_HEADROOM, 0.0)
    assert placed(d) == {2: 0}  # 2 of 3 slots taken by the two processes
