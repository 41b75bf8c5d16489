"""The memory family model: a fit of peak over batch size from measured members, OOM floors as
lower bounds, predictions for members never run. Pure: no database, no tmux."""

from __future__ import annotations

import math

from orchestrator.prediction.families import (
    FamilyFloor,
    FamilyPoint,
    across_families,
    family_of,
    fit_family,
    predict_member,
)
from orchestrator.prediction.learned import Knowledge
from orchestrator.prediction.memory import predict_peak_mib, shape_key
from orchestrator.prediction.shapes import RunningPeak
from orchestrator.store.peak_source import SourceKind
from orchestrator.store.rows import ShapeMemory


def _true_peak(batch: int) -> int:  # 2 GiB fixed + 28 MiB a sample
    return 2048 + 28 * batch


def test_family_key_ignores_batch_accumulation_and_length_only() -> None:
    base = {"model": "m", "lora_r": 16, "batch_size": 64, "gradient_accumulation_steps": 1, "max_seq_len": 256}
    tag = family_of(base, "m", "rte")
    assert tag is not None and (tag.batch_size, tag.tokens) == (64, 256)
    same = family_of({**base, "batch_size": 8, "gradient_accumulation_steps": 8, "max_seq_len": 128}, "m", "qnli")
    assert same is not None and same.family_key == tag.family_key
    other = family_of({**base, "lora_r": 32}, "m", "rte")
    assert other is not None and other.family_key != tag.family_key
    assert family_of({"model": "m", "lr": 1}, "m", "rte") is None  # no batch: no family
    renamed = family_of({"bs": 16, "model": "m"}, "m", "rte", batch_key="bs")
    assert renamed is not None and renamed.batch_size == 16


def test_one_point_bounds_smaller_batches_and_scales_larger_ones() -> None:
    fit = fit_family([FamilyPoint(128, None, "t", _true_peak(128))])
    assert fit is not None and fit.error_fraction == 0.0
    small = predict_member(fit, 32, None, "t")
    large = predict_member(fit, 256, None, "t")
    assert small is not None and large is not None
    assert _true_peak(32) <= small[0] <= math.ceil(_true_peak(128) * 1.05)
    assert _true_peak(256) <= large[0] <= math.ceil(_true_peak(128) * 2 * 1.05)


def test_two_points_give_the_line_and_a_third_its_error() -> None:
    fit = fit_family([FamilyPoint(b, None, "t", _true_peak(b)) for b in (32, 128)])
    assert fit is not None
    assert round(fit.fixed_mib) == 2048 and round(fit.per_unit_mib) == 28
    for batch in (16, 64, 96, 256):
        predicted = predict_member(fit, batch, None, "t")
        assert predicted is not None
        assert _true_peak(batch) <= predicted[0] <= _true_peak(batch) * 1.15, batch
    # a noisy third point: the error shows, and the margin covers it
    noisy = fit_family([*fit.points, FamilyPoint(64, None, "t", int(_true_peak(64) * 1.08))])
    assert noisy is not None and 0.03 < noisy.error_fraction < 0.08
    assert noisy.margin_fraction >= 2 * noisy.error_fraction


def test_tokens_multiply_the_batch_when_every_point_knows_them() -> None:
    points = [FamilyPoint(64, 128, "a", 2048 + 64 * 128 // 4), FamilyPoint(32, 256, "a", 2048 + 32 * 256 // 4 + 512)]
    fit = fit_family(points)
    assert fit is not None and fit.per_token
    predicted = predict_member(fit, 16, 512, "a")
    assert predicted is not None and 2048 + 16 * 512 // 4 <= predicted[0] <= (2048 + 16 * 512 // 4 + 512) * 1.2


def test_other_tasks_scale_by_learned_prompt_lengths_never_by_the_configured_bound() -> None:
    # sst2's prompts are short, rte's long: both configured at max_seq_len 256
    def peak(batch: int, prompt: int) -> int:
        return 2048 + batch * prompt // 2

    points = [FamilyPoint(b, 256, "sst2", peak(b, 60)) for b in (16, 64)]
    fit = fit_family(points)
    # lengths unknown: the family's largest peak bounds rte, never the sst2 fit at 256 tokens
    unknown = predict_member(fit, 64, 256, "rte")
    assert unknown is not None and unknown[0] >= peak(64, 60)
    learned = {"sst2": 60, "rte": 250}.get
    scaled = predict_member(fit, 64, 256, "rte", prompt_tokens=learned)
    assert scaled is not None and peak(64, 250) <= scaled[0] <= peak(64, 250) * 1.15


def test_another_task_without_lengths_takes_the_family_largest_peak() -> None:
    fit = fit_family([FamilyPoint(b, None, "rte", _true_peak(b)) for b in (32, 128)])
    predicted = predict_member(fit, 32, None, "qnli")
    assert predicted is not None and predicted[0] >= _true_peak(128)


def test_another_task_compares_as_it_does_in_other_families_of_the_model() -> None:
    # rte's prompts take 1.5x the memory of qnli's in two other configs of the model: the
    # family's qnli point predicts its rte member by that ratio, not by its largest peak
    own = [FamilyPoint(8, None, "qnli", 8000), FamilyPoint(8, None, "cola", 5000)]
    others = [[FamilyPoint(8, None, "qnli", 10_000), FamilyPoint(8, None, "rte", 15_000)],
              [FamilyPoint(8, None, "qnli", 6_000), FamilyPoint(8, None, "rte", 9_000),
               FamilyPoint(8, None, "cola", 3_750)]]
    # qnli 8000 × 1.5 (twice), cola 5000 × 2.4 (once): every pair says 12,000
    assert math.isclose(across_families(own, "rte", 8, others) or 0, 12_000)
    fit = fit_family(own)
    predicted = predict_member(fit, 8, None, "rte", others=others)
    assert predicted is not None and 12_000 < predicted[0] <= 12_000 * 1.05
    smaller = predict_member(fit, 8, None, "cola", others=others)  # its own task: its own point
    assert smaller is not None and smaller[0] <= 5000 * 1.05
    # no other family ran the task beside one of these, or only at another batch: the largest peak
    assert across_families(own, "mnli", 8, others) is None
    assert across_families(own, "rte", 8, [[FamilyPoint(16, None, "qnli", 1), FamilyPoint(16, None, "rte", 9)]]) is None
    # a member at a larger batch is scaled up as one measured batch is
    assert math.isclose(across_families(own[:1], "rte", 16, others[:1]) or 0, 24_000)


def test_knowledge_compares_tasks_only_within_the_model() -> None:
    tags, shapes = {}, {}
    for model, config, task, peak in (("m", "a", "qnli", 8000), ("m", "b", "qnli", 10_000), ("m", "b", "rte", 15_000),
                                      ("x", "c", "qnli", 1000), ("x", "c", "rte", 9000)):
        tag = family_of({"model": model, "cfg": config, "batch_size": 8}, model, task)
        assert tag is not None
        key = shape_key(f"{config}{task}", model, task)
        tags[key], shapes[key] = tag, ShapeMemory(peak, None, 1)
    knowledge = Knowledge(shapes, {}, tags=tags)
    member = family_of({"model": "m", "cfg": "a", "batch_size": 8}, "m", "rte")
    assert member is not None
    found = knowledge.family_prediction(member)
    assert found is not None and 12_000 < found[0] <= 12_600  # 8000 × 1.5 (model m), never × 9 (model x)


def test_an_oom_floor_raises_its_batch_and_larger_ones_never_smaller() -> None:
    fit = fit_family([FamilyPoint(32, None, "t", _true_peak(32))])
    floor = FamilyFloor(64, None, "t", 9000)
    at_64 = predict_member(fit, 64, None, "t", [floor])
    at_16 = predict_member(fit, 16, None, "t", [floor])
    assert at_64 is not None and at_64[0] >= 9000
    assert at_16 is not None and at_16[0] < 9000


def test_family_predicts_a_member_never_run_and_an_oom_retires_the_declared_figure() -> None:
    cfg = {"model": "m", "lora_r": 16}
    tags = {}
    shapes = {}
    for batch, peak in ((256, 9_318), (64, 3_900)):
        tag = family_of({**cfg, "batch_size": batch}, "m", "t")
        assert tag is not None
        key = shape_key(f"h{batch}", "m", "t")
        tags[key], shapes[key] = tag, ShapeMemory(peak, None, 1)
    knowledge = Knowledge(shapes, {}, tags=tags)
    member = family_of({**cfg, "batch_size": 128}, "m", "t")
    assert member is not None
    found = knowledge.family_prediction(member)
    assert found is not None and 5_800 <= found[0] <= 6_800 and len(found[1].points) == 2

    # a family that measured nothing: an OOM at the declared 3 GiB, where the attempt held 1.4 GiB
    # when cuBLAS failed, retires the declared figure; the low reading never lowers anything
    oomed = {shape_key("h256", "m", "t"): ShapeMemory(None, 1_434, 0)}
    tag256 = family_of({**cfg, "batch_size": 256}, "m", "t")
    assert tag256 is not None
    struck = Knowledge(oomed, {}, tags={shape_key("h256", "m", "t"): tag256})
    bound = struck.disproven_bound(member)
    assert bound == 0  # the floor is at a larger batch: it bounds nothing below it
    retry = predict_peak_mib(None, None, 3_072, disproven_mib=struck.disproven_bound(tag256))
    assert retry.source.kind is SourceKind.OOM_FLOOR and retry.mib > 3_072
    untouched = Knowledge({}, {}, tags={})
    assert untouched.disproven_bound(member) is None
    assert not struck.family_measured(member.family_key)
    # a running attempt past step K measures the family
    running = Knowledge(
        {},
        {shape_key("h256", "m", "t"): RunningPeak(9_000, 12)},
        tags={shape_key("h256", "m", "t"): tag256},
    )
    assert running.family_measured(member.family_key)


def test_a_family_shares_its_co_location_curve_and_min_stack_gain_stops_stacking() -> None:
    from orchestrator.prediction.throughput import family_curves, relative_curve
    from orchestrator.scheduling.packing.pack import pack
    from orchestrator.scheduling.packing.types import (
        GpuState,
        PackingPolicy,
        QueuedJob,
        RunningAttempt,
    )

    # b64 measured alone and three to a card (1.16x: compute-bound); b128 only alone
    shape_curves = {"s64": {0: relative_curve({1: 100.0, 2: 55.0, 3: 100.0 * 1.16 / 3})},
                    "s128": {0: relative_curve({1: 50.0})}, "other": {0: relative_curve({1: 10.0, 2: 9.0})}}
    shared = family_curves(shape_curves, {"s64": "fam", "s128": "fam"})
    assert set(shared) == {"fam"} and shared["fam"][0][1] == 1.0 and round(shared["fam"][0][3], 2) == 1.16
    # a job of the family never measured (b256) stacks by its siblings' curve: no third tenant
    # where the third adds 6 %, below min_stack_gain 10 %
    gpu = [GpuState(0, "GPU-0", 80_000, 70_000, 4)]
    running = [RunningAttempt(n, 0, 4_000, 4_000, True) for n in (1, 2)]
    job = QueuedJob(3, 0, 3, 4_000, 0.0, throughput_by_gpu=shared["fam"], min_stack_gain=0.10)
    decision = pack([job], gpu, running, PackingPolicy(), 0.0)
    assert not decision.placements and "below min_stack_gain" in decision.wait_reasons[3]
    assert pack([job], gpu, running[:1], PackingPolicy(), 0.0).placements  # the second still pays


def test_a_probing_family_takes_one_job_per_card_until_step_k() -> None:
    from orchestrator.scheduling.packing.pack import pack
    from orchestrator.scheduling.packing.types import (
        GpuState,
        PackingPolicy,
        QueuedJob,
        RunningAttempt,
    )

    gpus = [GpuState(0, "GPU-0", 80_000, 80_000, 4), GpuState(1, "GPU-1", 80_000, 80_000, 4)]
    queue = [QueuedJob(n, 0, n, 2_048, 0.0, probe_family="fam") for n in range(1, 5)]
    placed = pack(queue, gpus, [], PackingPolicy(), 0.0).placements
    assert sorted(p.gpu_index for p in placed) == [0, 1]  # one probe per card
    running = [RunningAttempt(1, 0, 2_048, 2_048, True, probe_family="fam")]
    decision = pack(queue[1:], gpus[:1], running, PackingPolicy(), 0.0)
    assert not decision.placements and "measuring its peak" in decision.wait_reasons[2]
    other = QueuedJob(9, 0, 9, 2_048, 0.0, probe_family="other")
    assert pack([other], gpus[:1], running, PackingPolicy(), 0.0).placements  # another family may share


def test_a_member_with_longer_sequences_is_never_predicted_below_its_familys_fit() -> None:
    # the comparison across families is by task and batch only: a member at 2048 tokens, where
    # the family's own points (128-512 tokens) grow with length, keeps the family's fit there
    own = [FamilyPoint(8, 128, "sst2", 4_000), FamilyPoint(8, 256, "sst2", 8_000), FamilyPoint(8, 512, "sst2", 16_000)]
    others = [[FamilyPoint(8, None, "sst2", 10_000), FamilyPoint(8, None, "rte", 11_000)]]
    fit = fit_family(own)
    assert fit is not None
    at_length = fit.at(8 * 2048)
    predicted = predict_member(fit, 8, 2048, "rte", others=others)
    assert predicted is not None and predicted[0] >= at_length, (predicted, at_length)
