"""Rules of the pure packing policy, one test (or a few) per rule."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.scheduling.packing.pack import outstanding_reservation_mib, pack
from orchestrator.scheduling.packing.types import GpuState, PackingPolicy, QueuedJob, RunningAttempt
from orchestrator.scheduling.waits import WaitKind

GIB = 1024
NO_HEADROOM = PackingPolicy(headroom_fraction=0.0)


def gpu(
    index: int, total_gib: float = 24, free_gib: float | None = None, slots: int = 2
) -> GpuState:
    total = int(total_gib * GIB)
    free = total if free_gib is None else int(free_gib * GIB)
    return GpuState(index, f"GPU-{index}", total, free, slots)


def job(job_id: int, need_gib: float, seq: int | None = None, **kw: object) -> QueuedJob:
    fields: dict[str, object] = {
        "priority": 0,
        "queued_seq": job_id if seq is None else seq,
        "predicted_peak_mib": int(need_gib * GIB),
        "waiting_since_s": 0.0,
    }
    fields.update(kw)
    return QueuedJob(job_id=job_id, **fields)  # type: ignore[arg-type]


def running(
    job_id: int,
    gpu_index: int,
    predicted_gib: float,
    held_gib: float,
    reached_peak: bool = False,
    run_alone: bool = False,
) -> RunningAttempt:
    return RunningAttempt(
        job_id, gpu_index, int(predicted_gib * GIB), int(held_gib * GIB), reached_peak, run_alone
    )


def placed(decision: object) -> dict[int, int]:
    return {p.job_id: p.gpu_index for p in decision.placements}  # type: ignore[attr-defined]


def test_places_on_an_empty_gpu_and_reserves_the_predicted_peak() -> None:
    d = pack([job(1, 8)], [gpu(0)], [], PackingPolicy(), 0.0)
    assert [(p.job_id, p.gpu_index, p.reserved_mib) for p in d.placements] == [(1, 0, 8 * GIB)]
    assert d.wait_reasons == {}


def test_headroom_is_a_fraction_of_the_card_and_the_boundary_is_inclusive() -> None:
    card = gpu(0, total_gib=10, free_gib=10)  # headroom 10% = 1 GiB
    assert placed(pack([job(1, 9)], [card], [], PackingPolicy(), 0.0)) == {1: 0}
    over = QueuedJob(1, 0, 1, 9 * GIB + 1, 0.0)
    d = pack([over], [gpu(0, total_gib=20, free_gib=10)], [], PackingPolicy(), 0.0)
    assert d.placements == ()
    assert "needs 9.0 GiB + 2.0 GiB headroom" in d.wait_reasons[1]


def test_plan_cap_counts_running_attempts_and_this_calls_placements() -> None:
    d = pack([job(1, 1), job(2, 1), job(3, 1)], [gpu(0, slots=2)], [], NO_HEADROOM, 0.0)
    assert placed(d) == {1: 0, 2: 0}
    assert d.wait_reasons[3] == "all allowed GPUs at their plan cap"
    busy = [running(9, 0, 1, 1, reached_peak=True)]
    assert placed(pack([job(1, 1), job(2, 1)], [gpu(0, slots=2)], busy, NO_HEADROOM, 0.0)) == {1: 0}


def test_a_gpu_with_zero_slots_gets_nothing() -> None:
    d = pack([job(1, 1)], [gpu(0, slots=0), gpu(1, slots=1)], [], NO_HEADROOM, 0.0)
    assert placed(d) == {1: 1}
    d = pack([job(1, 1)], [gpu(0, slots=0)], [], NO_HEADROOM, 0.0)
    assert d.placements == () and "0 slots" in d.wait_reasons[1]


def test_allowed_gpu_indices_are_honoured() -> None:
    d = pack(
        [job(1, 1, allowed_gpu_indices=frozenset({1}))], [gpu(0), gpu(1)], [], NO_HEADROOM, 0.0
    )
    assert placed(d) == {1: 1}
    d = pack([job(1, 1, allowed_gpu_indices=frozenset({5}))], [gpu(0)], [], NO_HEADROOM, 0.0)
    assert d.placements == () and d.wait_reasons[1] == "GPU 5 does not exist on this machine"


def test_ramping_attempts_reserve_what_they_have_not_yet_allocated() -> None:
    ramping = running(9, 0, predicted_gib=10, held_gib=2)
    assert outstanding_reservation_mib(ramping) == 8 * GIB
    # 20 GiB free now, 8 GiB of it owed to the ramping job: 12 GiB left, 12.5 does not fit
    card = gpu(0, total_gib=22, free_gib=20)
    d = pack([job(1, 12.5)], [card], [ramping], NO_HEADROOM, 0.0)
    assert d.placements == ()
    assert d.wait_reasons[1] == (
        "GPU 0: 12.0 GiB free (8.0 GiB reserved for ramping jobs), needs 12.5 GiB + 0.0 GiB headroom"
    )
    assert placed(pack([job(1, 12)], [card], [ramping], NO_HEADROOM, 0.0)) == {1: 0}


def test_attempts_past_their_peak_or_above_prediction_reserve_nothing() -> None:
    assert outstanding_reservation_mib(running(9, 0, 10, 2, reached_peak=True)) == 0
    assert outstanding_reservation_mib(running(9, 0, 10, 12)) == 0
    card = gpu(0, total_gib=22, free_gib=20)
    done = running(9, 0, predicted_gib=10, held_gib=2, reached_peak=True)
    assert placed(pack([job(1, 19)], [card], [done], NO_HEADROOM, 0.0)) == {1: 0}


def test_placements_in_one_call_reserve_their_full_peak() -> None:
    d = pack([job(1, 8), job(2, 8)], [gpu(0, total_gib=15)], [], NO_HEADROOM, 0.0)
    assert placed(d) == {1: 0}
    assert "GPU 0: 7.0 GiB free" in d.wait_reasons[2]


def test_run_alone_needs_an_empty_gpu_and_then_blocks_it() -> None:
    alone = job(1, 2, run_alone=True)
    busy = [running(9, 0, 1, 1, reached_peak=True)]
    d = pack([alone], [gpu(0, slots=4)], busy, NO_HEADROOM, 0.0)
    assert d.placements == () and d.wait_reasons[1] == "waiting to run alone on a GPU"
    d = pack([alone, job(2, 1)], [gpu(0, slots=4)], [], NO_HEADROOM, 0.0)
    assert placed(d) == {1: 0}
    assert "running a job alone" in d.wait_reasons[2]


def test_a_gpu_running_a_run_alone_attempt_takes_nothing_else() -> None:
    alone = [running(9, 0, 1, 1, reached_peak=True, run_alone=True)]
    d = pack([job(1, 1)], [gpu(0, slots=4), gpu(1, slots=1)], alone, NO_HEADROOM, 0.0)
    assert placed(d) == {1: 1}


def test_order_is_priority_then_queue_order() -> None:
    card = [gpu(0, total_gib=10, slots=4)]
    queue = [job(1, 6, seq=1), job(2, 6, seq=2, priority=5), job(3, 6, seq=0)]
    assert placed(pack(queue, card, [], NO_HEADROOM, 0.0)) == {2: 0}
    queue = [job(1, 6, seq=1), job(3, 6, seq=0)]
    assert placed(pack(queue, card, [], NO_HEADROOM, 0.0)) == {3: 0}


def test_equal_priority_jobs_start_longest_expected_first_and_unknown_before_known() -> None:
    one_slot = [gpu(0, total_gib=10, slots=1)]
    queue = [
        job(1, 6, expected_duration_s=600.0),
        job(2, 6, expected_duration_s=3600.0),
        job(3, 6, expected_duration_s=60.0),
    ]
    assert placed(pack(queue, one_slot, [], NO_HEADROOM, 0.0)) == {2: 0}
    # no estimate yet: it may be the longest of all, and running it teaches its estimate
    assert placed(pack([*queue, job(4, 6)], one_slot, [], NO_HEADROOM, 0.0)) == {4: 0}
    # equal estimates keep queue order
    tied = [job(5, 6, seq=9, expected_duration_s=60.0), job(6, 6, seq=1, expected_duration_s=60.0)]
    assert placed(pack(tied, one_slot, [], NO_HEADROOM, 0.0)) == {6: 0}


def test_a_job_taking_two_slots_of_memory_counts_its_run_twice() -> None:
    # 48 GiB over 3 slots: 16 GiB a slot; 16 GiB held by a running job leaves room for one of
    # the two. A 10-minute job of 32 GiB keeps two slots' worth of the card for its run (20
    # slot-minutes), so it goes before a 15-minute job of 8 GiB.
    card = [gpu(0, total_gib=48, free_gib=32, slots=3)]
    busy = [running(9, 0, 16, 16, reached_peak=True)]
    queue = [job(1, 8, expected_duration_s=900.0), job(2, 32, expected_duration_s=600.0)]
    assert placed(pack(queue, card, busy, NO_HEADROOM, 0.0)) == {2: 0}
    # ... but not before a job long enough to outweigh it (25 min > 20 slot-minutes)
    longer = [job(3, 8, expected_duration_s=1500.0), job(2, 32, expected_duration_s=600.0)]
    assert placed(pack(longer, card, busy, NO_HEADROOM, 0.0)) == {3: 0}
    # within one slot's share nothing is weighted: run time alone decides
    small = [job(4, 16, expected_duration_s=600.0), job(5, 4, expected_duration_s=700.0)]
    assert placed(pack(small, [gpu(0, total_gib=16, slots=1)], [], NO_HEADROOM, 0.0)) == {5: 0}


def test_longest_run_first_ignores_memory() -> None:
    lpt = PackingPolicy(headroom_fraction=0.0, order="longest_run_first")
    queue = [job(1, 8, expected_duration_s=900.0), job(2, 32, expected_duration_s=600.0)]
    busy = [running(9, 0, 16, 16, reached_peak=True)]
    assert placed(pack(queue, [gpu(0, total_gib=48, free_gib=32, slots=3)], busy, lpt, 0.0)) == {1: 0}


def test_priority_wins_over_a_longer_expected_run() -> None:
    one_slot = [gpu(0, total_gib=10, slots=1)]
    queue = [job(1, 6, expected_duration_s=9e9), job(2, 6, priority=1, expected_duration_s=1.0)]
    assert placed(pack(queue, one_slot, [], NO_HEADROOM, 0.0)) == {2: 0}


def test_fifo_order_ignores_expected_durations() -> None:
    fifo = PackingPolicy(headroom_fraction=0.0, order="fifo")
    queue = [job(1, 6, expected_duration_s=60.0), job(2, 6, expected_duration_s=3600.0)]
    assert placed(pack(queue, [gpu(0, total_gib=10, slots=1)], [], fifo, 0.0)) == {1: 0}


def test_the_long_head_job_that_does_not_fit_is_the_one_kept_a_card() -> None:
    # job 2 (long) waits past the starvation limit: the card is held for it, not for job 1
    queue = [
        job(1, 8, expected_duration_s=60.0),
        job(2, 8, expected_duration_s=3600.0),
        job(3, 1, expected_duration_s=30.0),
    ]
    busy = [running(9, 0, 4, 4, reached_peak=True)]
    policy = PackingPolicy(headroom_fraction=0.0, starvation_s=600.0)
    d = pack(queue, [gpu(0, total_gib=10, free_gib=6, slots=3)], busy, policy, 1000.0)
    assert placed(d) == {}
    assert "kept free for it" in d.wait_reasons[2]
    assert "kept free for job 2" in d.wait_reasons[3]


def test_a_smaller_later_job_backfills_when_the_head_does_not_fit() -> None:
    busy = [running(9, 0, 4, 4, reached_peak=True)]
    d = pack([job(1, 8), job(2, 4)], [gpu(0, total_gib=10, free_gib=6, slots=3)], busy, NO_HEADROOM, 0.0)
    assert placed(d) == {2: 0}
    assert 1 in d.wait_reasons


def test_a_starving_head_job_keeps_its_best_gpu_free() -> None:
    policy = PackingPolicy(headroom_fraction=0.0, starvation_s=600.0)
    cards = [gpu(0, total_gib=10, free_gib=6), gpu(1, total_gib=10, free_gib=3)]
    busy = [running(8, 0, 4, 4, reached_peak=True), running(9, 1, 7, 7, reached_peak=True)]
    queue = [job(1, 8, waiting_since_s=0.0), job(2, 2, waiting_since_s=700.0)]
    fresh = pack(queue, cards, busy, policy, now_s=500.0)  # head waited 500 s: backfill allowed
    assert placed(fresh) == {2: 0}
    starving = pack(queue, cards, busy, policy, now_s=720.0)  # 12 min: GPU 0 is the closest fit
    assert placed(starving) == {2: 1}
    assert "GPU 0 kept free for it" in starving.wait_reasons[1]
    full = [gpu(0, total_gib=10, free_gib=6), gpu(1, total_gib=10, free_gib=0)]
    blocked = pack(queue, full, busy, policy, now_s=720.0)
    assert blocked.placements == ()
    assert blocked.wait_reasons[2] == "held back: GPU 0 kept free for job 1 (waiting 12 min)"


def test_no_gpu_can_ever_fit_names_the_largest_card() -> None:
    # (above every card it would be capped to the largest: see the ceiling test below)
    only_small = frozenset({1})
    d = pack([job(1, 20, allowed_gpu_indices=only_small)], [gpu(0, total_gib=24), gpu(1, total_gib=16)], [],
             PackingPolicy(), 0.0)
    assert d.wait_reasons[1] == "no GPU can ever fit 20.0 GiB (largest card 16.0 GiB)"
    assert d.waits[1].kind is WaitKind.NEVER_FITS and d.waits[1].largest_mib == 16 * GIB


def test_headroom_shrinks_for_a_job_that_needs_most_of_an_empty_card() -> None:
    # 23 GiB on a 24 GiB card: the 2.4 GiB headroom would make it unplaceable for ever
    assert placed(pack([job(1, 23)], [gpu(0, total_gib=24)], [], PackingPolicy(), 0.0)) == {1: 0}
    d = pack([job(1, 23)], [gpu(0, total_gib=24, free_gib=23.5)], [], PackingPolicy(), 0.0)
    assert d.placements == ()


def test_a_measured_peaks_margin_counts_within_the_headroom_not_beside_it() -> None:
    # The TRL sweep on one H200 beside a ballast (24,575 MiB, 2,457 of headroom): a b128 job holds
    # 7,948 MiB at its peak; a b256 one measured at 13,866 is predicted 14,357 (a 3.5 % margin).
    card = GpuState(0, "GPU-0", 24_575, 24_575 - 7_948 - 105, 4)
    policy = PackingPolicy(headroom_max_mib=2_457)
    busy = [RunningAttempt(1, 0, 7_948, 7_948, reached_peak=True)]
    b256 = QueuedJob(2, 0, 2, 14_357, 0.0, margin_mib=491)
    assert placed(pack([b256], [card], busy, policy, 0.0)) == {2: 0}  # 13,866 + 2,457 fit 16,522
    # the same figure with no measured peak under it (an estimate) keeps the whole headroom beside it
    d = pack([replace(b256, margin_mib=0)], [card], busy, policy, 0.0)
    assert d.placements == () and "needs 14.0 GiB + 2.4 GiB headroom" in d.wait_reasons[2]
    # a margin above the headroom leaves none beside it: the prediction alone must fit
    wide = QueuedJob(3, 0, 3, 16_000, 0.0, margin_mib=3_000)
    assert placed(pack([wide], [card], busy, policy, 0.0)) == {3: 0}
    assert pack([replace(wide, predicted_peak_mib=16_523)], [card], busy, policy, 0.0).placements == ()
    # capped to the largest card, its figure is the cap's: no margin of a measure under it
    big = QueuedJob(4, 0, 4, 30_000, 0.0, margin_mib=1_000)
    assert pack([big], [GpuState(0, "GPU-0", 24_575, 24_575 - 1, 4)], [], policy, 0.0).placements == ()
    # above the cap (24,575 less 2,457) only by its margin: not capped, the measured peak fits an empty card
    near = QueuedJob(5, 0, 5, 22_500, 0.0, margin_mib=700)
    [whole] = pack([near], [GpuState(0, "GPU-0", 24_575, 24_575, 4)], [], policy, 0.0).placements
    assert not whole.capped and whole.reserved_mib == 22_500


def test_a_start_up_hold_keeps_the_whole_headroom_beside_it() -> None:
    # the margin is slack over the job's peak, not over what it holds while it starts: beside a
    # neighbour that ends in 10 s, its 516 MiB hold needs the whole 2,457 MiB of headroom now
    policy = PackingPolicy(headroom_max_mib=2_457, overlap=True)
    b256 = QueuedJob(2, 0, 2, 14_357, 0.0, margin_mib=491, ahead_s=20.0, startup_mib=516)

    def beside(held_mib: int) -> dict[int, int]:
        ending = [RunningAttempt(1, 0, held_mib, held_mib, reached_peak=True, expected_end_s=10.0)]
        return placed(pack([b256], [GpuState(0, "GPU-0", 24_575, 24_575 - held_mib, 4)], ending, policy, 0.0))

    assert beside(24_575 - 3_000) == {2: 0}  # 516 + 2,457 fit 3,000
    assert beside(24_575 - 2_700) == {}  # they do not fit 2,700, though 516 + (2,457 - 491) would


def test_spread_prefers_the_emptiest_card_and_best_fit_the_tightest() -> None:
    cards = [gpu(0, total_gib=48, free_gib=30, slots=3), gpu(1, total_gib=24, free_gib=20, slots=3)]
    busy = [running(9, 0, 18, 18, reached_peak=True)]
    assert placed(pack([job(1, 4)], cards, busy, PackingPolicy(placement="spread"), 0.0)) == {1: 1}
    assert placed(pack([job(1, 4)], cards, busy, PackingPolicy(placement="best_fit"), 0.0)) == {
        1: 1
    }
    two_empty = [gpu(0, total_gib=48), gpu(1, total_gib=24)]
    assert placed(pack([job(1, 4)], two_empty, [], PackingPolicy(placement="spread"), 0.0)) == {
        1: 0
    }
    assert placed(pack([job(1, 4)], two_empty, [], PackingPolicy(placement="best_fit"), 0.0)) == {
        1: 1
    }


def test_unknown_placement_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="placement"):
        pack([job(1, 1)], [gpu(0)], [], PackingPolicy(placement="random"), 0.0)


def test_unknown_order_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="order"):
        pack([job(1, 1)], [gpu(0)], [], PackingPolicy(order="shortest_first"), 0.0)


def test_pack_is_pure() -> None:
    queue, cards, busy = [job(1, 5), job(2, 30)], [gpu(0)], [running(9, 0, 4, 1)]
    first = pack(queue, cards, busy, PackingPolicy(), 100.0)
    assert pack(queue, cards, busy, PackingPolicy(), 100.0) == first
    assert queue == [job(1, 5), job(2, 30)]


def test_headroom_is_a_fraction_of_the_card_capped_in_mib() -> None:
    from orchestrator.scheduling.packing.pack import headroom_mib
    from orchestrator.scheduling.packing.types import GpuState, PackingPolicy

    small = GpuState(index=0, uuid="u0", total_mib=24 * 1024, free_mib=24 * 1024, slots=2)
    large = GpuState(index=1, uuid="u1", total_mib=141 * 1024, free_mib=141 * 1024, slots=2)
    policy = PackingPolicy()
    assert headroom_mib(small, policy) == int(0.10 * 24 * 1024)  # under the cap: 10%
    assert headroom_mib(large, policy) == 4096  # 10% would be 14.1 GiB
    assert headroom_mib(large, PackingPolicy(headroom_max_mib=None)) == int(0.10 * 141 * 1024)


def test_paused_suites_draining_and_a_hold_keep_jobs_queued_with_their_reason() -> None:
    queue = [job(1, 4, suite="a"), job(2, 4, suite="b")]
    d = pack(queue, [gpu(0)], [], NO_HEADROOM, 0.0, paused={"a"})
    assert placed(d) == {2: 0}
    assert d.waits[1].kind is WaitKind.PAUSED and d.wait_reasons[1] == "suite a is paused"
    drain = pack(queue, [gpu(0)], [], NO_HEADROOM, 0.0, draining=True)
    assert drain.placements == () and {w.kind for w in drain.waits.values()} == {WaitKind.DRAINING}
    full = pack(queue, [gpu(0)], [], NO_HEADROOM, 0.0, draining=True, hold="disk full")
    assert full.wait_reasons == {1: "disk full", 2: "disk full"}


def test_a_prediction_above_every_usable_card_is_capped_to_the_largest() -> None:
    policy = PackingPolicy(headroom_fraction=0.1, headroom_max_mib=None)
    cards = [gpu(0, total_gib=10), gpu(1, total_gib=20), gpu(2, total_gib=40, slots=0)]
    d = pack([job(1, 30), job(2, 5)], cards, [], policy, 0.0)
    [big] = [p for p in d.placements if p.job_id == 1]
    assert (big.gpu_index, big.reserved_mib, big.capped) == (1, 20 * GIB - int(0.1 * 20 * GIB), True)
    assert not next(p for p in d.placements if p.job_id == 2).capped


def test_a_starving_job_that_one_end_makes_room_for_holds_no_card() -> None:
    # GPU 0 is at its cap; whichever of its jobs ends first frees 6 GiB: the head job starts then
    policy = PackingPolicy(headroom_fraction=0.0, starvation_s=600.0)
    busy = [running(8, 0, 6, 6, reached_peak=True), running(9, 0, 6, 6, reached_peak=True),
            running(7, 1, 9, 9, reached_peak=True)]
    queue = [job(1, 8, waiting_since_s=0.0), job(2, 1, waiting_since_s=0.0)]
    cards = [gpu(0, total_gib=16, free_gib=4), gpu(1, total_gib=10, free_gib=1, slots=2)]
    d = pack(queue, cards, busy, policy, now_s=1000.0)
    assert placed(d) == {2: 1} and "kept free" not in d.wait_reasons[1]


def test_a_starving_job_keeps_its_card_from_when_it_fits_and_short_jobs_backfill_until_then() -> None:
    # the head needs both running jobs on GPU 0 gone (at 1600 s and 2000 s): it is kept from 2000 s
    policy = PackingPolicy(headroom_fraction=0.0, starvation_s=600.0)
    busy = [RunningAttempt(8, 0, 4 * GIB, 4 * GIB, True, expected_end_s=1600.0),
            RunningAttempt(9, 0, 4 * GIB, 4 * GIB, True, expected_end_s=2000.0)]
    queue = [job(1, 9, waiting_since_s=0.0), job(2, 1, expected_duration_s=600.0),
             job(3, 1, expected_duration_s=3000.0)]
    d = pack(queue, [gpu(0, total_gib=10, free_gib=2, slots=3)], busy, policy, now_s=1000.0)
    assert placed(d) == {2: 0}  # ends at 1600 s, before 2000 s; job 3 would not
    assert d.waits[3].kind is WaitKind.HELD_FOR_STARVING and d.waits[3].for_job == 1
    assert "reserved for job 1 (ready in ~17 min)" in d.wait_reasons[3]
    assert d.waits[1].kept_gpu == 0
