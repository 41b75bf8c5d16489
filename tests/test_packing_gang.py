"""Multi-GPU gangs, their reservations and backfill, host RAM and CPU cores in the pure `pack`."""

from __future__ import annotations

import math

from orchestrator.scheduling.packing.gang import HostState, closest_set, may_backfill, ready_at_s
from orchestrator.scheduling.packing.pack import pack
from orchestrator.scheduling.packing.types import PackingPolicy, RunningAttempt
from tests.test_packing import GIB, NO_HEADROOM, gpu, job

# two boards of two cards: 0-1 and 2-3 close, across boards far
TOPOLOGY = {(0, 1): 10, (2, 3): 10, (0, 2): 40, (0, 3): 40, (1, 2): 40, (1, 3): 40}


def busy(job_id: int, index: int, gib: float, end_s: float | None) -> RunningAttempt:
    return RunningAttempt(job_id, index, int(gib * GIB), int(gib * GIB), True, expected_end_s=end_s)


def test_a_gang_starts_only_when_n_cards_fit_at_once_and_gets_them_in_order() -> None:
    gpus = [gpu(i, slots=1) for i in range(4)]
    d = pack([job(1, 8, gpus=4)], gpus, [], NO_HEADROOM, 0.0)
    assert [(p.job_id, p.all_gpus) for p in d.placements] == [(1, (0, 1, 2, 3))]
    # one card taken: three fit, the gang waits whole; nothing is placed for it
    d = pack([job(1, 8, gpus=4)], gpus, [busy(9, 2, 4, 100.0)], NO_HEADROOM, 0.0)
    assert d.placements == ()
    assert "needs 4 GPUs with 8.0 GiB + headroom free each: 3 fit now (GPU 0, 1, 3)" in d.wait_reasons[1]


def test_per_rank_peak_must_fit_on_every_card() -> None:
    gpus = [gpu(0), gpu(1, free_gib=6), gpu(2)]
    d = pack([job(1, 8, gpus=2)], gpus, [], NO_HEADROOM, 0.0)
    assert d.placements[0].all_gpus == (0, 2)
    d = pack([job(1, 8, gpus=3)], gpus, [], NO_HEADROOM, 0.0)
    assert d.placements == ()


def test_a_gang_prefers_close_cards() -> None:
    gpus = [gpu(i) for i in range(4)]
    running = [busy(9, 0, 2, 50.0)]  # card 0 is the least attractive by spread
    d = pack([job(1, 4, gpus=2)], gpus, running, NO_HEADROOM, 0.0, topology=TOPOLOGY)
    assert d.placements[0].all_gpus == (2, 3)
    assert closest_set([0, 1, 2, 3], 2, lambda i: i, TOPOLOGY, lambda i: (i != 1, i)) == [0, 1]
    assert closest_set([0, 2, 3], 2, lambda i: i, TOPOLOGY, lambda i: i) == [2, 3]


def test_a_gang_larger_than_the_usable_cards_never_holds_cards() -> None:
    gpus = [gpu(0), gpu(1, slots=0)]
    d = pack([job(1, 4, gpus=2), job(2, 4)], gpus, [], NO_HEADROOM, 0.0)
    assert [p.job_id for p in d.placements] == [2]
    assert "only 1 allowed GPU(s) can ever fit a rank" in d.wait_reasons[1]


def test_a_waiting_gang_reserves_cards_and_only_jobs_ending_in_time_backfill() -> None:
    gpus = [gpu(i, slots=1) for i in range(4)]
    running = [busy(8, 0, 8, 600.0), busy(9, 1, 8, 600.0)]  # cards 0, 1 free at t=600
    gang = job(1, 8, gpus=4, expected_duration_s=3600.0)
    short = job(2, 8, expected_duration_s=300.0)  # ends at 300 < 600: backfills
    long = job(3, 8, expected_duration_s=1200.0)  # would end after the gang's cards are ready
    unknown = job(4, 8)  # unknown run time counts as long: never backfills a reservation
    d = pack([gang, short, long, unknown], gpus, running, NO_HEADROOM, 0.0)
    assert {p.job_id for p in d.placements} == {2}
    assert "reserved for it as they free up" in d.wait_reasons[1]
    assert "backfilling only jobs that end before then" in d.wait_reasons[1]
    assert "reserved for multi-GPU job 1" in d.wait_reasons[3]
    assert "would run ~20 min" in d.wait_reasons[3]
    assert "run time is not known" in d.wait_reasons[4]


def test_unknown_ends_allow_no_backfill_on_reserved_cards() -> None:
    gpus = [gpu(i, slots=1) for i in range(2)]
    d = pack([job(1, 8, gpus=2), job(2, 8, expected_duration_s=1.0)], gpus, [busy(9, 0, 8, None)], NO_HEADROOM, 0.0)
    assert d.placements == ()


def test_a_job_may_share_a_reserved_card_when_both_fit_under_the_cap() -> None:
    gpus = [gpu(0, slots=2), gpu(1, free_gib=4, slots=2)]
    running = [busy(9, 1, 20, 600.0)]
    d = pack([job(1, 8, gpus=2), job(2, 8)], gpus, running, NO_HEADROOM, 0.0)
    assert [p.job_id for p in d.placements] == [2]  # 8 + 8 fit on card 0 beside the gang's rank


def test_the_stream_of_one_gpu_jobs_does_not_starve_a_gang() -> None:
    """Virtual time: one-GPU jobs of unknown length keep arriving ahead of a 4-GPU job."""
    gpus = [gpu(i, slots=1) for i in range(4)]
    running: list[RunningAttempt] = [busy(100 + i, i, 8, 100.0 * (i + 1)) for i in range(4)]
    gang = job(1, 8, gpus=4, expected_duration_s=1000.0)
    next_id = 200
    for now in range(0, 1000, 50):
        running = [r for r in running if r.expected_end_s is None or r.expected_end_s > now]
        stream = [job(next_id + k, 8, seq=0) for k in range(4)]  # ahead in queue order, unknown length
        next_id += 4
        d = pack([gang, *stream], gpus, running, NO_HEADROOM, float(now))
        if any(p.job_id == 1 for p in d.placements):
            assert now == 400  # the last running card frees at t=400
            return
        running += [busy(p.job_id, p.gpu_index, 8, now + 300.0) for p in d.placements]
    raise AssertionError("the 4-GPU job never started")


def test_host_ram_and_cores_hold_jobs_back_with_a_reason() -> None:
    host = HostState(available_mib=10 * GIB, total_mib=64 * GIB, free_cpus=4)
    gpus = [gpu(i) for i in range(3)]
    jobs = [job(1, 4, host_mib=6 * GIB), job(2, 4, host_mib=6 * GIB), job(3, 4, host_mib=2 * GIB, cpus=8)]
    d = pack(jobs, gpus, [], NO_HEADROOM, 0.0, host=host)
    assert [p.job_id for p in d.placements] == [1]
    assert d.wait_reasons[2] == "host RAM: 4.0 GiB free, needs 6.0 GiB"
    assert d.wait_reasons[3] == "CPU cores: 4 free, needs 8"
    assert host.available_mib == 4 * GIB


def test_helpers() -> None:
    assert ready_at_s(10.0, [50.0, 30.0]) == 50.0
    assert math.isinf(ready_at_s(10.0, [50.0, None]))
    assert ready_at_s(10.0, []) == 10.0
    assert may_backfill(100.0, 0.0, 100.0) and not may_backfill(101.0, 0.0, 100.0)
    assert not may_backfill(None, 0.0, 100.0) and not may_backfill(1.0, 0.0, math.inf)


def test_pack_of_a_gang_is_pure_and_policy_defaults_hold() -> None:
    gpus = [gpu(i) for i in range(2)]
    queue = [job(1, 4, gpus=2)]
    assert pack(queue, gpus, [], PackingPolicy(), 0.0) == pack(queue, gpus, [], PackingPolicy(), 0.0)
