"""When a job fits a card: one answer (scheduling/packing/fit_time.py) for the starvation hold and
the later-level choice. The four cases where the hold's own copy disagreed with the choice's."""

from __future__ import annotations

import math

from orchestrator.scheduling.packing.cards import cards_of, place_on
from orchestrator.scheduling.packing.fit_time import card_fits_at_s, fits_at_s
from orchestrator.scheduling.packing.holds import hold_for_starving
from orchestrator.scheduling.packing.types import GpuState, PackingPolicy, QueuedJob, RunningAttempt

GIB = 1024
POLICY = PackingPolicy(headroom_fraction=0.0)


def gpu(free_gib: float, slots: int = 3) -> GpuState:
    return GpuState(0, "GPU-0", 24 * GIB, int(free_gib * GIB), slots)


def running(ends_s: float | None, gib: float = 10, job_id: int = 9) -> RunningAttempt:
    return RunningAttempt(job_id, 0, int(gib * GIB), int(gib * GIB), True, expected_end_s=ends_s)


def job(gib: float, job_id: int = 5, minutes: float | None = 100) -> QueuedJob:
    return QueuedJob(
        job_id,
        0,
        0,
        int(gib * GIB),
        -10_000.0,
        expected_duration_s=None if minutes is None else minutes * 60,
    )


def held_until(
    waiting: QueuedJob,
    free_gib: float,
    attempts: list[RunningAttempt],
    placed: list[QueuedJob] = (),
    now_s: float = 0.0,
) -> float:  # type: ignore[assignment]
    """What the hold sets on the card it keeps for `waiting` (it must keep one)."""
    card = cards_of([gpu(free_gib)], attempts, POLICY)[0]
    for other in placed:
        place_on(card, other, now_s)
    kept = hold_for_starving(waiting, [card], now_s)
    assert kept is card
    return card.held_until_s


def test_an_end_in_the_way_unknown_is_no_fit_time() -> None:
    # 9 GiB free + two tenants of 10: the job of 20 needs both ends, one of them unknown
    attempts = [running(600.0, job_id=8), running(None)]
    card = cards_of([gpu(4)], attempts, POLICY)[0]
    assert card_fits_at_s(job(20), card, 0.0) is None
    assert held_until(job(20), 4, attempts) == math.inf  # no time by which backfill surely ends


def test_a_job_that_never_fits_is_inf_not_the_last_end() -> None:
    # 9 GiB free and a tenant of 10 ending at 1 h: 19 GiB then, never 20 (5 GiB are another's)
    attempts = [running(3600.0)]
    card = cards_of([gpu(9)], attempts, POLICY)[0]
    assert card_fits_at_s(job(20), card, 0.0) == math.inf
    assert fits_at_s(20 * GIB, 9 * GIB, 1, 3, [(3600.0, 10 * GIB)], 0.0) == math.inf
    assert held_until(job(20), 9, attempts) == math.inf  # the hold said 3600 s: it would not fit


def test_foreign_memory_with_nothing_of_ours_running_never_fits() -> None:
    # nothing of ours on the card, 9 GiB free (the rest another process's): the hold said "now"
    card = cards_of([gpu(9)], [], POLICY)[0]
    assert card_fits_at_s(job(20), card, 0.0) == math.inf
    assert held_until(job(20), 9, []) == math.inf


def test_jobs_placed_earlier_in_the_pass_hold_their_memory_until_they_end() -> None:
    # 12 GiB free, a tenant of 10 ends at 10 min; a job of 8 placed this pass runs 50 min: the
    # job of 20 fits once both have ended (50 min), not at the tenant's end (the hold's answer)
    attempts = [running(600.0)]
    placed = [job(8, job_id=7, minutes=50)]
    card = cards_of([gpu(12)], attempts, POLICY)[0]
    place_on(card, placed[0], 0.0)
    assert card_fits_at_s(job(20), card, 0.0) == 3000.0
    assert held_until(job(20), 12, attempts, placed) == 3000.0
    # a placed job of unknown length: when the memory comes back is unknown
    card = cards_of([gpu(12)], attempts, POLICY)[0]
    place_on(card, job(8, job_id=7, minutes=None), 0.0)
    assert card_fits_at_s(job(20), card, 0.0) is None


def test_a_job_that_fits_after_the_ends_fits_at_the_end_that_makes_room() -> None:
    attempts = [running(600.0, gib=6, job_id=8), running(1800.0, gib=6)]
    assert held_until(job(20), 9, attempts) == 1800.0
