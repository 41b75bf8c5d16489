"""OOM evidence carried across ladder rungs and the level a job starts at (pure core)."""

from __future__ import annotations

import math
from dataclasses import replace

from orchestrator.lifecycle import AttemptOutcome
from orchestrator.prediction.carried import (
    LevelEvidence,
    LevelNeed,
    above_disproved,
    carried_floor,
    gib,
    no_level_fits,
    rung_savings,
    start_level,
    with_evidence,
)
from orchestrator.prediction.memory import Prediction, update_shape
from orchestrator.store.peak_source import PredictionSource, SourceKind

GIB = 1024


def _declared(mib: int) -> Prediction:
    return Prediction(mib, PredictionSource(SourceKind.DECLARED))


def test_the_floor_itself_where_no_saving_is_known() -> None:
    evidence = [LevelEvidence(0, floor_mib=17 * GIB, disproved_mib=6 * GIB)]
    carried = carried_floor(evidence, 1, lambda rung: None)
    assert carried is not None and (carried.mib, carried.level, carried.saving) == (17 * GIB, 0, 1.0)
    raised = with_evidence(_declared(6 * GIB), evidence, 1, lambda rung: None)
    assert raised.mib == 17 * GIB and raised.source == PredictionSource(SourceKind.OOM_FLOOR, level=0)
    assert "OOM floor of level 0" in raised.source.render()


def test_savings_scale_the_floor_rung_by_rung() -> None:
    savings = {1: 0.5, 2: None, 3: 0.8}
    assert rung_savings(savings.get, 0, 3) == 0.4
    evidence = [LevelEvidence(0, floor_mib=20 * GIB), LevelEvidence(2, floor_mib=11 * GIB)]
    # level 0's floor at level 3: 20 × 0.5 × 1 × 0.8 = 8; level 2's: 11 × 0.8 = 8.8 wins
    carried = carried_floor(evidence, 3, savings.get)
    assert carried is not None and carried.level == 2 and carried.mib == math.ceil(11 * GIB * 0.8)
    # a "saving" above 1 or not a number is never an increase
    assert rung_savings({1: 1.7, 2: float("nan"), 3: -1.0}.get, 0, 3) == 1.0


def test_the_disproved_figure_is_never_used_again_at_any_rung() -> None:
    evidence = [LevelEvidence(0, floor_mib=8 * GIB, disproved_mib=6 * GIB)]
    # checkpointing measured at level 2 says 4 GiB: the disproved 6 GiB still bounds it
    measured = Prediction(4 * GIB, PredictionSource(SourceKind.MEASURED))
    for target in (0, 1, 2, 5):
        raised = with_evidence(measured, evidence, target, {1: 0.3, 2: 0.3}.get)
        assert raised.mib > 6 * GIB
    assert above_disproved(evidence, 3) == 6 * GIB + 1
    assert above_disproved([LevelEvidence(2, disproved_mib=9 * GIB)], 1) is None  # above the target: no word


def test_a_measurement_of_the_shape_at_the_level_outranks_a_carried_floor() -> None:
    evidence = [LevelEvidence(0, floor_mib=17 * GIB)]
    for kind in (SourceKind.MEASURED, SourceKind.RUNNING):
        measured = Prediction(12 * GIB, PredictionSource(kind))
        assert with_evidence(measured, evidence, 1, lambda rung: None) == measured
    family = Prediction(12 * GIB, PredictionSource(SourceKind.FAMILY, points=2, error=0.01))
    assert with_evidence(family, [], 1, lambda rung: None) is family


def test_a_family_fit_from_other_shapes_never_lowers_the_carried_floor() -> None:
    # OOM floor 18 GiB at level 0, rung saving 0.85: 15.3 GiB carried to level 1, where a fit over
    # other batch sizes says 7 GiB; packed at 7 GiB beside a 9 GiB job it would OOM again
    evidence = [LevelEvidence(0, floor_mib=18 * GIB)]
    family = Prediction(7 * GIB, PredictionSource(SourceKind.FAMILY, points=3, error=0.02))
    raised = with_evidence(family, evidence, 1, {1: 0.85}.get)
    assert raised.mib == math.ceil(18 * GIB * 0.85) and raised.source == PredictionSource(SourceKind.OOM_FLOOR, level=0)
    larger = Prediction(16 * GIB, PredictionSource(SourceKind.FAMILY, points=3, error=0.02))
    assert with_evidence(larger, evidence, 1, {1: 0.85}.get) == larger  # max(carried, fit)


def test_an_oom_records_the_figure_it_disproved() -> None:
    first = update_shape(None, 8 * GIB, AttemptOutcome.OOM, 12 * GIB, placed_mib=6 * GIB)
    assert first.disproved_mib == 6 * GIB and first.oom_floor_mib == 12 * GIB
    again = update_shape(first, None, AttemptOutcome.OOM, 13 * GIB, placed_mib=9 * GIB)
    assert again.disproved_mib == 9 * GIB
    done = update_shape(again, 5 * GIB, AttemptOutcome.SUCCEEDED, None)
    assert done.disproved_mib == 9 * GIB  # a success does not give the disproved figure back


def _needs(*rows: tuple[int, float, bool, bool]) -> list[LevelNeed]:
    return [LevelNeed(level, round(gib_ * GIB), proven, exact) for level, gib_, proven, exact in rows]


def test_start_at_the_first_level_predicted_to_fit_preferring_exact() -> None:
    needs = _needs((0, 24.6, True, True), (1, 26, False, True), (2, 20, False, False), (3, 18, False, True))
    choice = start_level(needs, 0, 24 * GIB)
    assert choice is not None and choice.level == 3  # exact, fits; level 2 fits too but changes numbers
    assert choice.note == "started at level 3: level 0 needs ≥ 24.6 GiB, the cards hold 24 GiB after headroom"
    inexact_only = _needs((0, 26, True, True), (1, 26, False, True), (2, 20, False, False))
    # level 1's saving was measured: too little
    inexact_only[1] = replace(inexact_only[1], measured=True)
    assert start_level(inexact_only, 0, 24 * GIB) == start_level(inexact_only, 0, 24 * GIB, verb="started")
    assert start_level(inexact_only, 0, 24 * GIB).level == 2  # type: ignore[union-attr]


def test_an_exact_level_nothing_measured_is_tried_before_an_inexact_one() -> None:
    # one OOM at level 0; checkpointing (exact) carries the floor with no saving shown, half
    # batch (inexact) is estimated to fit: the exact rung is tried, not skipped on a guess
    needs = _needs(
        (0, 26, True, True), (1, 26, False, True), (2, 26, False, True), (3, 20, False, False)
    )
    choice = start_level(needs, 0, 24 * GIB)
    assert choice is not None and choice.level == 1
    assert choice.note == (
        "started at level 1: level 0 needs ≥ 26 GiB, the cards hold 24 GiB after headroom "
        "(level 1 keeps numbers bit-equal and is tried before level 3, which changes them: "
        "nothing has measured what it saves yet)"
    )
    # once there, it stays to be tried: a guess does not move it on to half batch
    assert start_level(needs[1:], 1, 24 * GIB, verb="goes on") is None
    # once its own OOM proves it too large (or a measurement shows it saves too little), it moves on
    proven = [needs[0], replace(needs[1], proven=True), replace(needs[2], measured=True), needs[3]]
    choice = start_level(proven[1:], 1, 24 * GIB, verb="goes on")
    assert choice is not None and choice.level == 3


def test_nothing_predicted_to_fit_tries_the_next_level_not_proven_too_large() -> None:
    needs = _needs((0, 26, True, True), (1, 26, True, True), (2, 26, False, True), (3, 26, False, False))
    choice = start_level(needs, 0, 24 * GIB)
    assert choice is not None and choice.level == 2
    assert "no rung has shown how much it saves yet" in choice.note
    # a level only predicted too large is kept until a later one is predicted to fit
    assert start_level(_needs((0, 26, False, True), (1, 26, False, True)), 0, 24 * GIB) is None
    # a level that may fit stays
    assert start_level(_needs((0, 20, True, True), (1, 10, False, True)), 0, 24 * GIB) is None


def test_no_level_fits_says_so() -> None:
    proven = _needs((2, 30, True, True), (3, 25, True, True))
    assert (
        no_level_fits(proven, 24 * GIB)
        == "no level of its ladder fits: level 3 needs ≥ 25 GiB, the cards hold 24 GiB after headroom"
    )
    assert no_level_fits(_needs((2, 30, True, True), (3, 25, False, True)), 24 * GIB) is None
    assert gib(24.6 * GIB) == "24.6 GiB" and gib(24 * GIB) == "24 GiB"


def test_other_seeds_after_an_oom_try_checkpointing_before_half_batch() -> None:
    """A LoRA config OOMs at level 0 (a 40 GiB floor); the worker's estimate carries that floor to
    checkpointing at ~7.9 GiB and to half batch at ~6.1 GiB, on a 7 GiB card. Checkpointing's
    saving is only estimated: it is tried, not skipped for half batch."""
    from orchestrator.prediction.job_facts import JobShapeCache, job_levels, job_shape_key
    from orchestrator.scheduling.packing.types import GpuState, PackingPolicy
    from orchestrator.scheduling.start_levels import start_moves
    from orchestrator.store.rows import ShapeMemory
    from tests.test_schedule_steps import a_job, entry, facts_for, readings

    config = {"model": "/data/gla-1.3B", "batch_size": 16, "gradient_accumulation_steps": 1,
              "max_seq_len": 1024, "peft": {"r": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]}}
    cache = JobShapeCache()
    seeds = [a_job(n, worker="lora", config=config) for n in (1, 2, 3)]
    levels = job_levels(seeds[0], cache)
    assert [levels[1].rung, levels[4].rung] == ["checkpointing", "halve_batch"]
    shared = facts_for(seeds[0], cache, levels[0])  # seeds of one config share their facts
    card = [GpuState(0, "GPU-0", 7 * GIB, 7 * GIB, 1)]
    oom = {job_shape_key(seeds[0], levels[0]): ShapeMemory(None, 40 * GIB, 0)}
    [move] = start_moves([entry(job) for job in seeds], {job.id: shared for job in seeds},
                         readings(shapes=oom), cache, card, PackingPolicy(headroom_fraction=0.0))
    assert (move.job_ids, move.level) == ((1, 2, 3), 1)
    assert "level 1 keeps numbers bit-equal and is tried before level 4" in move.note
    # once checkpointing has OOM'd too (its own floor), they go on past the exact rungs it proves
    at_1 = facts_for(seeds[0], cache, levels[1])
    both = {**oom, job_shape_key(seeds[0], levels[1]): ShapeMemory(None, 9 * GIB, 0)}
    [move] = start_moves([entry(job, level=1) for job in seeds], {job.id: at_1 for job in seeds},
                         readings(shapes=both), cache, card, PackingPolicy(headroom_fraction=0.0))
    assert move.level == 4


def test_a_measured_peak_under_the_ceiling_stays_at_its_level_though_its_margin_is_above() -> None:
    from orchestrator.prediction.job_facts import JobShapeCache, job_levels, job_shape_key
    from orchestrator.scheduling.packing.types import GpuState, PackingPolicy
    from orchestrator.scheduling.start_levels import start_moves
    from orchestrator.store.rows import ShapeMemory
    from tests.test_schedule_steps import a_job, entry, facts_for, readings

    config = {"model": "/data/gla-1.3B", "batch_size": 16, "gradient_accumulation_steps": 1,
              "max_seq_len": 1024, "peft": {"r": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]}}
    cache = JobShapeCache()
    job = a_job(1, worker="lora", config=config)
    level = job_levels(job, cache)[0]
    card = [GpuState(0, "GPU-0", 24 * GIB, 24 * GIB, 1)]  # 21.6 GiB after the 10 % headroom

    def moves(peak_mib: int) -> list[object]:
        shapes = {job_shape_key(job, level): ShapeMemory(peak_mib, None, 1)}
        return list(start_moves([entry(job)], {1: facts_for(job, cache, level)}, readings(shapes=shapes), cache, card,
                                PackingPolicy()))

    assert moves(21 * GIB) == []  # 21 GiB + 5 % is above 21.6 GiB; 21 GiB and the headroom fit the card
    assert len(moves(22 * GIB)) == 1  # the peak itself is above: it moves to a later level
