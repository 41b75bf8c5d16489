"""The level that ends soonest where a queued job could start at more than one: the pure rule
(orchestrator.scheduling.packing.level_choice), `pack` applying it, and the run times it rests on."""

from __future__ import annotations

import math
from pathlib import Path

from orchestrator.plans.ladder_spec import load_ladder
from orchestrator.prediction.durations import CompletedRun, DurationTable
from orchestrator.prediction.ladder import exact_levels_after, expand_levels
from orchestrator.scheduling.packing.fit_time import fits_at_s
from orchestrator.scheduling.packing.level_choice import (
    LevelOption,
    move_note,
    own_fit_s,
    sooner_level,
)
from orchestrator.scheduling.packing.pack import pack
from orchestrator.scheduling.packing.types import GpuState, PackingPolicy, QueuedJob, RunningAttempt

GIB = 1024
NO_HEADROOM = PackingPolicy(headroom_fraction=0.0)


def option(level: int, gib: float, minutes: float | None, exact: bool = True) -> LevelOption:
    return LevelOption(level, int(gib * GIB), None if minutes is None else minutes * 60, exact)


# ---- when a level fits a card ------------------------------------------------------------------

def test_fits_now_when_the_card_has_the_memory_and_a_slot() -> None:
    assert fits_at_s(8 * GIB, 10 * GIB, 1, 2, [(500.0, 6 * GIB)], now_s=100.0) == 100.0


def test_fits_at_the_end_of_the_attempt_that_frees_enough() -> None:
    frees = [(900.0, 4 * GIB), (300.0, 2 * GIB)]  # ends out of order: the sooner one counts first
    assert fits_at_s(8 * GIB, 3 * GIB, 2, 3, frees, now_s=0.0) == 900.0  # 3 + 2 < 8 ≤ 3 + 2 + 4
    assert fits_at_s(5 * GIB, 3 * GIB, 2, 3, frees, now_s=0.0) == 300.0


def test_a_full_plan_waits_for_a_slot_even_with_memory() -> None:
    assert fits_at_s(1 * GIB, 20 * GIB, 2, 2, [(700.0, 1 * GIB), (400.0, 1 * GIB)], now_s=0.0) == 400.0


def test_an_attempt_in_the_way_with_no_expected_end_leaves_the_wait_unknown() -> None:
    assert fits_at_s(8 * GIB, 3 * GIB, 2, 3, [(math.inf, 9 * GIB)], now_s=0.0) is None


def test_never_where_other_processes_hold_the_rest() -> None:
    assert fits_at_s(20 * GIB, 2 * GIB, 1, 2, [(300.0, 4 * GIB)], now_s=0.0) == math.inf


def test_a_job_that_runs_alone_waits_for_every_attempt() -> None:
    assert fits_at_s(2 * GIB, 20 * GIB, 2, 4, [(100.0, 1 * GIB), (800.0, 1 * GIB)], 0.0, alone=True) == 800.0


def test_the_soonest_known_card_counts() -> None:
    assert own_fit_s([None, 900.0, math.inf, 300.0]) == 300.0
    assert own_fit_s([None, None]) is None


# ---- which level -------------------------------------------------------------------------------

def test_a_later_level_that_ends_sooner_is_chosen() -> None:
    # own: fits in 30 min, runs 10 -> ends at 40 min; level 1 fits now and runs 13 min
    chosen = sooner_level(600.0, 1800.0, [option(1, 6, 13)], now_s=0.0)
    assert chosen is not None and chosen.level == 1


def test_the_own_level_stays_when_it_ends_sooner_despite_the_wait() -> None:
    assert sooner_level(600.0, 120.0, [option(1, 6, 13)], now_s=0.0) is None  # 12 min against 13


def test_an_inexact_rung_is_never_chosen_for_speed() -> None:
    assert sooner_level(600.0, math.inf, [option(2, 4, 5, exact=False)], now_s=0.0) is None


def test_nothing_moves_on_an_unknown_figure() -> None:
    assert sooner_level(None, 1800.0, [option(1, 6, 13)], 0.0) is None  # own run time unknown
    assert sooner_level(600.0, None, [option(1, 6, 13)], 0.0) is None  # own wait unknown
    assert sooner_level(600.0, 1800.0, [option(1, 6, None)], 0.0) is None  # its run time unknown


def test_of_several_the_one_that_ends_soonest() -> None:
    chosen = sooner_level(600.0, 3600.0, [option(1, 8, 20), option(3, 6, 15)], now_s=0.0)
    assert chosen is not None and chosen.level == 3


# ---- in pack ------------------------------------------------------------------------------------

def card(free_gib: float, slots: int = 3) -> GpuState:
    return GpuState(0, "GPU-0", 24 * GIB, int(free_gib * GIB), slots)


def tenant(ends_s: float | None, gib: float = 10) -> RunningAttempt:
    return RunningAttempt(9, 0, int(gib * GIB), int(gib * GIB), True, expected_end_s=ends_s)


def queued(options: tuple[LevelOption, ...], minutes: float | None = 10, **kw: object) -> QueuedJob:
    return QueuedJob(1, 0, 1, 14 * GIB, 0.0, expected_duration_s=None if minutes is None else minutes * 60,
                     alternatives=options, **kw)  # type: ignore[arg-type]


def test_pack_starts_a_job_at_the_exact_level_that_ends_sooner() -> None:
    d = pack([queued((option(1, 8, 13),))], [card(9)], [tenant(3600.0)], NO_HEADROOM, 0.0)
    [p] = d.placements
    assert (p.level, p.reserved_mib) == (1, 8 * GIB)
    assert "level 1" in p.level_note and "level 0 would wait ~60 min" in p.level_note


def test_a_short_job_s_note_says_seconds_not_zero_minutes() -> None:
    note = move_note(0, option(1, 8, 17 / 60), own_expected_s=20.0, own_fit_at_s=105.0, now_s=100.0)
    assert note == ("started at level 1, an exact rung that fits now and ends sooner (~17 s): "
                    "level 0 would wait ~5 s and run ~20 s")
    assert "(~13 min): level 0 would wait ~60 min and run ~10 min" in move_note(0, option(1, 8, 13), 600.0, 3600.0, 0.0)


def test_a_later_level_keeps_the_whole_headroom_its_own_levels_margin_does_not_cover() -> None:
    # a margin over its own level's measured peak says nothing of the later level's figure: at level 1
    # (8 GiB) it needs the card's whole 2.4 GiB of headroom, which 9.8 GiB free does not hold
    at_level_0 = queued((option(1, 8, 13),), margin_mib=3 * GIB)
    assert pack([at_level_0], [card(9.8)], [tenant(3600.0)], PackingPolicy(), 0.0).placements == ()
    assert [p.level for p in pack([at_level_0], [card(10.5)], [tenant(3600.0)], PackingPolicy(), 0.0).placements] == [1]


def test_pack_keeps_the_job_at_its_level_when_waiting_ends_sooner() -> None:
    d = pack([queued((option(1, 8, 13),))], [card(9)], [tenant(60.0)], NO_HEADROOM, 0.0)
    assert d.placements == () and 1 in d.waits


def test_pack_never_takes_an_inexact_rung_for_speed() -> None:
    d = pack([queued((option(2, 5, 5, exact=False),))], [card(9)], [tenant(3600.0)], NO_HEADROOM, 0.0)
    assert d.placements == ()


def test_pack_keeps_the_level_while_the_wait_is_unknown() -> None:
    d = pack([queued((option(1, 8, 13),))], [card(9)], [tenant(None)], NO_HEADROOM, 0.0)
    assert d.placements == ()


def test_a_job_that_fits_at_its_level_stays_there() -> None:
    d = pack([queued((option(1, 8, 5),))], [card(20)], [tenant(3600.0, gib=4)], NO_HEADROOM, 0.0)
    [p] = d.placements
    assert p.level is None and p.reserved_mib == 14 * GIB


def test_capacity_a_job_can_use_at_its_own_level_is_never_spent_on_a_slower_one() -> None:
    # job 1 comes first (longest) and would end sooner at level 1, but job 2 fits the same
    # 9 GiB at its own level: job 2 starts, job 1 waits at its level
    other = QueuedJob(2, 0, 2, 8 * GIB, 0.0, expected_duration_s=300.0)
    d = pack([queued((option(1, 8, 13),)), other], [card(9, slots=2)], [tenant(3600.0)], NO_HEADROOM, 0.0)
    assert [(p.job_id, p.level) for p in d.placements] == [(2, None)] and 1 in d.waits
    # with room for both (level 1 takes 5 GiB), job 1 takes what is left at level 1
    d = pack([queued((option(1, 5, 13),)), other], [card(13.5)], [tenant(3600.0)], NO_HEADROOM, 0.0)
    assert sorted((p.job_id, p.level) for p in d.placements) == [(1, 1), (2, None)] and 1 not in d.waits


def test_a_later_level_respects_a_card_kept_for_a_starving_job() -> None:
    # job 5 (first in order) has waited past the starvation limit; no single end makes room for
    # it, so the card is kept for it from when it is expected to fit (the tenant's end, 60 min).
    # Job 1 at level 1 backfills the kept card only if it ends before then.
    starving = QueuedJob(5, 0, 0, 18 * GIB, -10_000.0, expected_duration_s=10_000.0)
    policy = PackingPolicy(headroom_fraction=0.0, starvation_s=600.0)
    short = pack([starving, queued((option(1, 8, 13),))], [card(9)], [tenant(3600.0)], policy, 0.0)
    assert [(p.job_id, p.level) for p in short.placements] == [(1, 1)]
    long = pack([starving, queued((option(1, 8, 90),), minutes=80)], [card(9)], [tenant(3600.0)], policy, 0.0)
    assert long.placements == ()
    assert pack([queued((option(1, 8, 90),), minutes=80)], [card(9)], [tenant(3600.0)], policy, 0.0).placements


# ---- the run times it rests on -----------------------------------------------------------------

def test_a_rungs_slowdown_is_learned_from_runs_at_both_levels() -> None:
    table = DurationTable([CompletedRun("a", "rte", 0, 600), CompletedRun("a", "rte", 1, 780),
                           CompletedRun("a", "qnli", 0, 3000), CompletedRun("b", "qnli", 0, 3000)])
    assert math.isclose(table.slowdown("a", 0, 1) or 0, 1.3)
    assert math.isclose(table.expected_at_level_s("a", "qnli", 1, 0) or 0, 3900.0)  # its own level's × the slowdown
    assert table.expected_at_level_s("a", "rte", 1, 0) == 780.0  # measured there
    assert table.expected_at_level_s("a", "qnli", 3, 0) is None  # no rung cost assumed
    # another config's level 1 may be another rung: its slowdown is not borrowed
    assert table.slowdown("b", 0, 1) is None and table.expected_at_level_s("b", "qnli", 1, 0) is None


def test_exact_levels_stop_at_the_first_rung_that_changes_numerics() -> None:
    ladder = load_ladder([{"name": "checkpointing", "checkpointing": True}, "halve_batch", {"data_workers": 0},
                          "run_alone"])
    levels = expand_levels(ladder, {"batch_size": 2, "gradient_accumulation_steps": 1, "num_data_workers": 2,
                                    "gradient_checkpointing": False}, one_token_task=False)
    assert [lv.index for lv in exact_levels_after(levels, 0)] == [1]
    assert [lv.index for lv in exact_levels_after(levels, 2)] == [3, 4]


# ---- the daemon's pass: what `pack` is offered, and what a claim at a later level records ---------

def test_the_pass_offers_later_exact_levels_with_known_run_times_and_claims_the_chosen_one() -> None:
    from orchestrator.gpu.snapshot import GpuSnapshot
    from orchestrator.prediction.job_facts import JobShapeCache, job_levels, job_shape_key
    from orchestrator.scheduling.pack_inputs import claim_plans, pack_inputs
    from orchestrator.store.peak_source import SourceKind
    from orchestrator.store.rows import ShapeMemory
    from tests.test_schedule_steps import a_job, entry, facts_for, readings

    cache = JobShapeCache()
    job = a_job(1, worker="sim")  # declared 4 GiB; level 1 checkpoints and was measured at 2000 MiB
    level_1 = job_levels(job, cache)[1]
    assert level_1.rung == "checkpointing"
    durations = DurationTable([CompletedRun("c", "d", 0, 600.0), CompletedRun("c", "d", 1, 780.0)])
    shapes = {job_shape_key(job, level_1): ShapeMemory(2000, None, 1)}
    inputs = pack_inputs([entry(job)], {1: facts_for(job, cache)}, readings(shapes=shapes, durations=durations),
                         cache, None)
    [queued_job] = inputs.queue
    # only level 1 has a known run time: levels 2 and 3 (exact too) have no learned slowdown
    assert [(o.level, o.expected_duration_s, o.exact) for o in queued_job.alternatives] == [(1, 780.0, True)]
    assert queued_job.alternatives[0].predicted_peak_mib >= 2000
    gpu = GpuState(0, "GPU-0", 8 * GIB, 3 * GIB, 2)  # 3 GiB free: level 0 (4 GiB) waits an hour
    decision = pack(inputs.queue, [gpu], [tenant(3600.0, gib=4)], NO_HEADROOM, 0.0)
    snapshot = GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=8 * GIB, used_mib=5 * GIB,
                           free_mib=3 * GIB, processes=())
    [plan] = claim_plans(decision, inputs, {1: facts_for(job, cache)}, [snapshot])
    assert plan.level.index == 1 and plan.source.kind is SourceKind.MEASURED and plan.level_note


def test_a_job_placed_at_a_later_level_moves_there_with_its_note_before_its_attempt_starts(tmp_path: Path) -> None:
    from orchestrator.gpu.snapshot import GpuSnapshot
    from orchestrator.lifecycle import JobState
    from orchestrator.plans import expand_jobs, load_suite, parse_pairs
    from orchestrator.prediction.job_facts import JobShapeCache, job_levels
    from orchestrator.scheduling.dispatch import DispatchContext, _claim_and_launch
    from orchestrator.scheduling.pack_inputs import ClaimPlan
    from orchestrator.store import Store
    from orchestrator.store.jobs import cancel_queued, submit_jobs
    from orchestrator.store.peak_source import PredictionSource, SourceKind
    from orchestrator.store.sweep_attempts import all_attempts
    from tests.conftest import REPO_ROOT
    from tests.store_reads import job_ids, read_jobs
    from tests.test_scale import _Recorder

    store = Store(tmp_path / "state.db")
    suite = load_suite("demo", REPO_ROOT / "plans")
    submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:glue_rte"), {}, None, 0), allowed_gpus=None,
                priority=0, force=False, dry_run=False)
    first, gone = job_ids(store)[:2]
    [job] = [j for j in read_jobs(store) if j.id == first]
    level_1 = job_levels(job, JobShapeCache())[1]
    gpu = GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=24 * GIB, used_mib=0, free_mib=24 * GIB,
                      processes=())
    note = "started at level 1, an exact rung that fits now and ends sooner (~13 min): level 0 would wait ~60 min"

    def plan(job_id: int) -> ClaimPlan:
        return ClaimPlan(job_id, level_1, gpu, (gpu,), 2000, PredictionSource(SourceKind.MEASURED), 2000, 0, note)

    cancel_queued(store, gone, "not wanted")  # left the queue between pack and the claim: not started
    _claim_and_launch(store, _Recorder(), DispatchContext(tmp_path / "runs", PackingPolicy(), {}),
                      [plan(first), plan(gone)])
    jobs = {j.id: j for j in read_jobs(store)}
    assert (jobs[first].state, jobs[first].level, jobs[first].level_note) == (JobState.RUNNING, 1, note)
    assert jobs[gone].state is JobState.CANCELLED and jobs[gone].level == 0
    [attempt] = all_attempts(store)
    assert (attempt.job_id, attempt.level) == (first, 1)


def test_the_daemons_pass_starts_a_waiting_job_at_the_exact_level_that_ends_sooner(tmp_path: Path) -> None:
    from orchestrator.gpu.snapshot import GpuSnapshot
    from orchestrator.plans import GpuPlan, expand_jobs, load_suite, parse_pairs
    from orchestrator.prediction.job_facts import JobShapeCache, job_levels, job_shape_key
    from orchestrator.scheduling.dispatch import DispatchContext, schedule
    from orchestrator.scheduling.state import SchedulerState
    from orchestrator.store import Store
    from orchestrator.store.attempts import write_shape
    from orchestrator.store.jobs import cancel_queued, set_gpu_plan, submit_jobs
    from orchestrator.store.rows import ShapeMemory
    from orchestrator.store.sweep_attempts import all_attempts
    from tests.conftest import REPO_ROOT
    from tests.store_reads import read_jobs
    from tests.test_scale import _Recorder

    store = Store(tmp_path / "state.db")
    suite = load_suite("demo", REPO_ROOT / "plans")
    submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:glue_rte"), {}, None, 0), allowed_gpus=None,
                priority=0, force=False, dry_run=False)
    running, waiting, third = read_jobs(store)
    cancel_queued(store, third.id, "not in this test")
    cache = JobShapeCache()
    levels = job_levels(waiting, cache)
    # what this machine learned: the running job's peak and run time; the waiting job's at levels
    # 0 and 1 (checkpointing: 6 GiB instead of 14, 13 min instead of 10)
    write_shape(store, job_shape_key(running, job_levels(running, cache)[0]), ShapeMemory(10 * GIB, None, 1))
    write_shape(store, job_shape_key(waiting, levels[0]), ShapeMemory(14 * GIB, None, 1))
    write_shape(store, job_shape_key(waiting, levels[1]), ShapeMemory(6 * GIB, None, 1))
    state = SchedulerState()
    for config, level, seconds in ((running.config_name, 0, 3600.0), (waiting.config_name, 0, 600.0),
                                   (waiting.config_name, 1, 780.0)):
        state.durations.add(CompletedRun(config, running.data, level, seconds))
    ctx = DispatchContext(tmp_path / "runs", PackingPolicy(order="fifo"), {})
    gpu = (GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=24 * GIB, used_mib=0, free_mib=24 * GIB,
                       processes=()),)
    set_gpu_plan(store, GpuPlan(slots_by_gpu={}, default_slots=1))
    first = schedule(store, gpu, _Recorder(), ctx, state, draining=False)
    assert [p.job_id for p in first.placements] == [running.id]
    # a second slot: 10 GiB is reserved for the running job, so level 0 (14 GiB + headroom) waits
    # for its end in an hour; level 1 fits now and ends in 13 minutes
    set_gpu_plan(store, GpuPlan(slots_by_gpu={}, default_slots=2))
    second = schedule(store, gpu, _Recorder(), ctx, state, draining=False)
    assert [(p.job_id, p.level) for p in second.placements] == [(waiting.id, 1)]
    moved = {j.id: j for j in read_jobs(store)}[waiting.id]
    assert moved.level == 1 and moved.level_note is not None and "ends sooner" in moved.level_note
    [attempt] = [a for a in all_attempts(store) if a.job_id == waiting.id]
    assert attempt.level == 1 and attempt.predicted_peak_mib >= 6 * GIB


H_S = 3600.0
SLOWER = (LevelOption(1, 20_000, 3 * H_S, exact=True),)  # fits beside anything, three times slower


def test_a_job_waits_for_one_placed_in_the_same_pass_rather_than_run_three_times_slower() -> None:
    # an idle card: job 1 takes it at level 0; job 2 waits an hour for it and runs an hour,
    # which beats three hours at level 1 now (the card's new job ends too, not only running ones)
    queue = [QueuedJob(i, 0, i, 50_000, 0.0, expected_duration_s=H_S, alternatives=SLOWER) for i in (1, 2)]
    decision = pack(queue, [GpuState(0, "u0", 81_920, 81_920, 2)], [], PackingPolicy(), 1000.0)
    assert [(p.job_id, p.level) for p in decision.placements] == [(1, None)]


def test_an_attempt_in_the_way_with_no_expected_end_moves_no_job() -> None:
    # card 0: an attempt with no expected end; card 1: a foreign process that never leaves
    queue = [QueuedJob(2, 0, 2, 50_000, 0.0, expected_duration_s=H_S, alternatives=SLOWER)]
    running = [RunningAttempt(1, 0, 60_000, 60_000, True, expected_end_s=None)]
    gpus = [GpuState(0, "u0", 81_920, 81_920 - 60_000, 2), GpuState(1, "u1", 81_920, 81_920 - 50_000, 2)]
    assert pack(queue, gpus, running, PackingPolicy(), 1000.0).placements == ()
