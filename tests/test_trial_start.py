"""A start on trial: under an MPS fence a job starts into less room than its prediction asks, as
long as that room holds the least it could need, fenced at that room; an OOM under that fence
requeues it at its level, not counted, and it never starts on trial again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from orchestrator.gpu.mps import MpsControl, MpsDirs, MpsState, client_env
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.lifecycle import AttemptOutcome, JobState
from orchestrator.prediction.families import FamilyFloor, FamilyPoint, least_member_mib
from orchestrator.prediction.job_facts import ShapeFacts
from orchestrator.prediction.learned import Knowledge
from orchestrator.prediction.least import least_mib
from orchestrator.prediction.shapes import RunningPeak
from orchestrator.scheduling.packing.pack import pack
from orchestrator.scheduling.packing.trial import TRIAL_SLACK_FRACTION, trial_room
from orchestrator.scheduling.packing.types import GpuState, PackingPolicy, QueuedJob, RunningAttempt
from orchestrator.store.rows import FamilyTag, ShapeMemory
from tests.test_next_step import LEVELS, a_job, ended

# The TRL sweep on one H200 beside a ballast: 24,575 MiB left, 2,457 MiB of headroom; b256 peaks
# at 13,866 MiB, b128 at 7,948 (NVML), and both fit with one headroom (24,271 MiB).
CARD_MIB, HEADROOM_MIB = 24_575, 2_457
B256_MIB, B128_MIB = 13_866, 7_948
POLICY = PackingPolicy(headroom_max_mib=HEADROOM_MIB)


def card(free_mib: int, *, fenced: bool = True, slots: int = 4) -> list[GpuState]:
    return [GpuState(0, "GPU-0", CARD_MIB, free_mib, slots, fenced=fenced)]


def queued(job_id: int, predicted_mib: int, least: int | None, **kw: Any) -> QueuedJob:
    return QueuedJob(job_id, 0, job_id, predicted_mib, 0.0, least_mib=least, **kw)


def running(job_id: int, held_mib: int, end_s: float | None = None) -> RunningAttempt:
    return RunningAttempt(job_id, 0, held_mib, held_mib, reached_peak=True, expected_end_s=end_s)


def _room(**changes: Any) -> tuple[int, bool] | None:
    values: dict[str, Any] = {"least_mib": 8_000, "headroom_mib": 2_000, "available_mib": 11_000, "used_slots": 1,
                              "slots": 4, "overlap": False, "ahead_s": None, "startup_mib": 500, "frees": [],
                              "now_s": 0.0}
    values.update(changes)
    return trial_room(**values)


# ------------------------------------------------------------------ the rule, pure


def test_a_trial_takes_the_room_there_is_where_it_holds_the_least_plus_slack_and_headroom() -> None:
    assert _room() == (9_000, False)  # 11,000 free less 2,000 headroom: its fence
    least_fits = int(9_000 / (1 + TRIAL_SLACK_FRACTION))  # 8,823 × 1.02 + 2,000 ≤ 11,000
    assert _room(least_mib=least_fits) == (9_000, False)
    assert _room(least_mib=least_fits + 2) is None  # the slack no longer fits
    assert _room(used_slots=4) is None  # no plan slot
    # with overlap: the room an attempt ending within its start-up frees
    ending = [(30.0, 6_000)]
    assert _room(available_mib=6_000, used_slots=4, frees=ending) is None
    assert _room(available_mib=6_000, used_slots=4, frees=ending, overlap=True, ahead_s=40.0) == (10_000, True)
    assert _room(available_mib=6_000, used_slots=4, frees=ending, overlap=True, ahead_s=20.0) is None  # too far


def test_the_least_a_family_member_could_need_is_a_bound_from_below() -> None:
    b256 = FamilyPoint(256, None, "t", B256_MIB)
    # the fixed part is never negative: half the batch needs at least half the peak
    assert least_member_mib([b256], [], 128, None, "t") == B256_MIB // 2
    # memory never shrinks with more samples: a smaller batch's peak bounds a larger one
    assert least_member_mib([FamilyPoint(64, None, "t", 5_000)], [], 128, None, "t") == 5_000
    assert least_member_mib([b256], [], 128, None, "other") is None  # another task's prompts: nothing
    assert least_member_mib([b256], [FamilyFloor(128, None, "t", 9_000)], 128, None, "t") == 9_000  # an OOM's floor
    assert least_member_mib([b256], [FamilyFloor(128, None, "other", 9_000)], 128, None, "t") == B256_MIB // 2
    # a point at a shorter length and a batch no larger bounds it; one at another length and a
    # larger batch does not (attention may grow faster than the length)
    assert least_member_mib([FamilyPoint(128, 256, "t", 6_000)], [], 128, 512, "t") == 6_000
    assert least_member_mib([FamilyPoint(256, 512, "t", 12_000)], [], 128, 256, "t") is None
    assert least_member_mib([FamilyPoint(256, 512, "t", 12_000)], [], 128, 512, "t") == 6_000


def _facts(key: str = "k|m|t", family: FamilyTag | None = None) -> ShapeFacts:
    return ShapeFacts(config={}, shape_key=key, length_key="", job=a_job(), family=family)


def test_the_least_a_job_could_need_is_its_shapes_peak_else_its_familys_bound_and_none_after_an_oom() -> None:
    assert least_mib(_facts(), {"k|m|t": ShapeMemory(B128_MIB, None, 1)}, Knowledge({}, {})) == B128_MIB
    live = Knowledge({}, {"k|m|t": RunningPeak(B128_MIB + 10, 12)})
    assert least_mib(_facts(), {"k|m|t": ShapeMemory(B128_MIB, None, 1)}, live) == B128_MIB + 10
    # an OOM struck the shape (a trial's own, say): it starts where its prediction fits
    assert least_mib(_facts(), {"k|m|t": ShapeMemory(B128_MIB, B128_MIB, 1)}, Knowledge({}, {})) is None
    assert least_mib(_facts(), {"k|m|t": ShapeMemory(None, None, 0, 8_000)}, Knowledge({}, {})) is None
    # never run: its family's b256 point, halved
    tags = {"b256|m|t": FamilyTag("fam|m", 256, None, "t")}
    knowledge = Knowledge({}, {"b256|m|t": RunningPeak(B256_MIB, 12)}, tags=tags)
    assert least_mib(_facts(family=FamilyTag("fam|m", 128, None, "t")), {}, knowledge) == B256_MIB // 2
    assert least_mib(_facts(), {}, knowledge) is None  # no family, no peak: nothing bounds it


# ------------------------------------------------------------------ packing


def test_a_member_predicted_at_its_familys_larger_peak_starts_beside_it_on_trial() -> None:
    free = CARD_MIB - B256_MIB  # 10,709: its prediction (the b256 peak + 10 %) does not fit
    b128 = queued(2, int(B256_MIB * 1.1), B256_MIB // 2)
    unfenced = pack([b128], card(free, fenced=False), [running(1, B256_MIB)], POLICY, 0.0)
    assert unfenced.placements == () and "GiB free, needs" in unfenced.wait_reasons[2]
    fenced = pack([b128], card(free), [running(1, B256_MIB)], POLICY, 0.0)
    room = free - HEADROOM_MIB
    assert [(p.job_id, p.reserved_mib, p.trial_fence_mib, p.ahead) for p in fenced.placements] == [
        (2, room, room, False)]
    assert room > B128_MIB  # its true peak fits the fence
    # one room, one trial: a second such job waits
    again = pack([b128, queued(3, int(B256_MIB * 1.1), B256_MIB // 2)], card(free), [running(1, B256_MIB)],
                 POLICY, 0.0)
    assert [p.job_id for p in again.placements] == [2]


def test_a_measured_job_whose_margin_does_not_fit_starts_on_trial_and_one_that_fits_does_not() -> None:
    free = CARD_MIB - B128_MIB  # 16,627: 13,866 × 1.05 + 2,457 = 17,017 does not fit
    b256 = queued(4, int(B256_MIB * 1.05), B256_MIB)
    decision = pack([b256], card(free), [running(2, B128_MIB)], POLICY, 0.0)
    assert [(p.trial_fence_mib, p.reserved_mib) for p in decision.placements] == [(free - HEADROOM_MIB,) * 2]
    roomy = pack([b256], card(CARD_MIB), [], POLICY, 0.0)  # it fits at its prediction: no trial, no fence
    assert [(p.trial_fence_mib, p.reserved_mib) for p in roomy.placements] == [(None, b256.predicted_peak_mib)]
    # its least plus the slack and headroom does not fit either: it waits
    assert pack([queued(5, 16_000, 14_500)], card(free), [running(2, B128_MIB)], POLICY, 0.0).placements == ()


def test_a_trial_starts_ahead_into_the_room_an_ending_attempt_frees() -> None:
    # b256 #1 ends at 100 s; a job of 7,700 MiB runs beside it; b256 #2 (learned start-up 30 s,
    # 516 MiB) may start at 75 s into what is free then: 24,575 - 7,700 = 16,875, where its
    # prediction and headroom (17,016) do not fit
    busy = [running(1, B256_MIB, end_s=100.0), running(2, 7_700)]
    b256 = queued(3, int(B256_MIB * 1.05), B256_MIB, ahead_s=30.0, startup_mib=516)
    policy = PackingPolicy(headroom_max_mib=HEADROOM_MIB, overlap=True)
    free = CARD_MIB - B256_MIB - 7_700
    decision = pack([b256], card(free), busy, policy, 75.0)
    room = CARD_MIB - 7_700 - HEADROOM_MIB
    assert [(p.trial_fence_mib, p.ahead) for p in decision.placements] == [(room, True)]
    assert pack([b256], card(free), busy, policy, 60.0).placements == ()  # its end is too far off
    # its start-up hold and headroom must fit now, as for any start ahead
    crowded = [running(1, B256_MIB, end_s=100.0), running(2, B128_MIB)]
    assert pack([b256], card(CARD_MIB - B256_MIB - B128_MIB), crowded, policy, 75.0).placements == ()


def test_a_trial_keeps_the_cards_whole_headroom_beside_others() -> None:
    # beside a larger card (full), a job predicted at 24,400 MiB may have the smaller card alone
    # with 175 MiB of headroom; a trial beside a neighbour keeps the card's whole 2,457 (its fence
    # does not count its CUDA context)
    free = CARD_MIB - 10_000
    cards = [*card(free), GpuState(1, "GPU-1", 48_000, 0, 1, fenced=True)]
    busy = [running(1, 10_000), RunningAttempt(9, 1, 47_000, 47_000, reached_peak=True)]
    assert pack([queued(2, 24_400, 12_000)], cards, busy, POLICY, 0.0).placements == ()
    fits = pack([queued(2, 24_400, 11_000)], cards, busy, POLICY, 0.0)
    assert [(p.gpu_index, p.trial_fence_mib) for p in fits.placements] == [(0, free - HEADROOM_MIB)]


def test_a_card_that_fits_the_prediction_comes_before_one_that_takes_a_trial() -> None:
    # card 0 is idle (spread's first choice) but only a trial fits there; card 1 fits the job whole
    cards = [GpuState(0, "GPU-0", 16_000, 12_000, 4, fenced=True), GpuState(1, "GPU-1", CARD_MIB, CARD_MIB - 5_000,
                                                                             4, fenced=True)]
    decision = pack([queued(2, 12_000, 8_000)], cards, [RunningAttempt(1, 1, 5_000, 5_000, reached_peak=True)],
                    POLICY, 0.0)
    assert [(p.gpu_index, p.trial_fence_mib) for p in decision.placements] == [(1, None)]


def test_one_trial_of_a_kind_at_a_time() -> None:
    # two cards, each with room for a trial: the second seed waits until the first shows its fit
    cards = [GpuState(i, f"GPU-{i}", CARD_MIB, CARD_MIB - B256_MIB, 4, fenced=True) for i in (0, 1)]
    busy = [RunningAttempt(10 + i, i, B256_MIB, B256_MIB, reached_peak=True) for i in (0, 1)]
    seeds = [queued(j, int(B256_MIB * 1.1), B256_MIB // 2, config="b128", suite="s") for j in (2, 3)]
    decision = pack(seeds, cards, busy, POLICY, 0.0)
    assert [p.job_id for p in decision.placements] == [2]
    # and the one that waits is told why it gets no trial of its own
    said = decision.wait_reasons[3]
    assert said.startswith("GPU ") and said.endswith("no start on trial until one of its kind started on trial "
                                                     "shows its peak"), said
    # a seed of the kind that may use only an unfenced card could never start on trial: not told so
    mixed = [cards[0], GpuState(1, "GPU-1", CARD_MIB, CARD_MIB - B256_MIB, 4, fenced=False)]
    unfenced_only = queued(3, int(B256_MIB * 1.1), B256_MIB // 2, config="b128", suite="s",
                           allowed_gpu_indices=frozenset({1}))
    waits = pack([seeds[0], unfenced_only], mixed, busy, POLICY, 0.0).wait_reasons
    assert "GPU 1" in waits[3] and "trial" not in waits[3], waits
    # across passes: a live trial of the shape before step K keeps the others from a trial
    from orchestrator.prediction.learned import unproven_trials
    from tests.rows_helpers import attempt_of, job_of

    job = job_of(id=2)
    for step, unproven in ((3, True), (12, False), (None, True)):
        trial = attempt_of(job_id=2, trial_fence_mib=8_252, progress_json={"step": step} if step is not None else {})
        assert unproven_trials([trial], {2: job}, lambda j, a: "k") == ({"k"} if unproven else set())
    assert unproven_trials([attempt_of(job_id=2, progress_json={"step": 3})], {2: job}, lambda j, a: "k") == set()


def test_no_trial_for_a_gang_a_job_alone_or_a_fused_member() -> None:
    free = CARD_MIB - B256_MIB
    for other in (dict(gpus=2), dict(run_alone=True), dict(fuse_group="g", fuse_cap=4)):
        job = queued(2, int(B256_MIB * 1.1), B256_MIB // 2, **other)
        assert all(p.trial_fence_mib is None for p in pack([job], card(free), [running(1, B256_MIB)], POLICY,
                                                           0.0).placements)


# ------------------------------------------------------------------ its fence and its end


def test_a_trial_is_fenced_at_its_room_whatever_its_prediction() -> None:
    dirs = MpsDirs(Path("/p"), Path("/l"))
    assert client_env(dirs, 15_253, measured=False, trial_fence_mib=8_252)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == \
        "0=8252M"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in client_env(dirs, 15_253, measured=False)


def test_an_oom_under_a_trials_fence_requeues_it_at_its_level_not_counted() -> None:
    step = decide(AttemptOutcome.OOM, trial_fence_mib=8_252)
    assert step.job_state is JobState.QUEUED and step.next_level is None and not step.counted
    assert "8.1 GiB it was started into on trial" in step.why
    assert decide(AttemptOutcome.OOM).next_level == 1  # an ordinary start's OOM goes down the ladder
    failed = decide(AttemptOutcome.FAILED, trial_fence_mib=8_252)  # not memory: its own, as ever
    assert failed.counted


def decide(outcome: AttemptOutcome, trial_fence_mib: int | None = None) -> Any:
    from orchestrator.attempts.next_step import decide_next

    return decide_next(a_job(), LEVELS, LEVELS[0], ended(outcome, "CUDA out of memory"),
                       trial_fence_mib=trial_fence_mib)


# ------------------------------------------------------------------ the daemon's pass


def _suite(plans: Path) -> None:
    (plans / "configs" / "tr").mkdir(parents=True)
    (plans / "suites").mkdir(parents=True)
    (plans / "configs" / "tr" / "b128.yaml").write_text(yaml.safe_dump({"model": "m", "batch_size": 128}))
    (plans / "suites" / "tr.yaml").write_text(yaml.safe_dump(
        {"worker": "python train.py {config}", "mem_gib": 3, "configs": ["b128"]}))


def test_the_daemons_pass_starts_a_trial_fenced_at_its_room_and_says_so(tmp_path: Path) -> None:
    from orchestrator.plans import GpuPlan, expand_jobs, load_suite, parse_pairs
    from orchestrator.prediction.job_facts import (
        JobShapeCache,
        job_family_tag,
        job_levels,
        job_shape_key,
    )
    from orchestrator.scheduling.dispatch import DispatchContext, schedule
    from orchestrator.scheduling.state import SchedulerState
    from orchestrator.store import Store
    from orchestrator.store.attempts import write_shape
    from orchestrator.store.jobs import set_gpu_plan, submit_jobs
    from orchestrator.store.learning import label_shape
    from orchestrator.store.sweep_attempts import all_attempts
    from tests.store_reads import events, read_jobs
    from tests.test_scale import _Recorder

    def one_pass(root: Path, mps: bool, passes: int = 1) -> tuple[Any, list[Any], _Recorder]:
        _suite(root / "plans")
        suite = load_suite("tr", root / "plans")
        store = Store(root / "state.db")
        set_gpu_plan(store, GpuPlan(slots_by_gpu={}, default_slots=4))
        submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:toy 2:toy"), {}, None, 0), allowed_gpus=None,
                    priority=0, force=False, dry_run=False)
        # its memory family has measured only b256: the b128 is predicted above it, and the least it
        # could need is half of it (a measured b128 would fit beside the headroom without a trial)
        job = read_jobs(store)[0]
        b256 = replace(job, config={**job.config, "batch_size": 256})
        level = job_levels(b256, JobShapeCache())[0]
        write_shape(store, job_shape_key(b256, level), ShapeMemory(B256_MIB, None, 1))
        label_shape(store, job_shape_key(b256, level), "tr", "b256", job_family_tag(b256, level))
        control = MpsControl(MpsDirs(root / "mps" / "pipe", root / "mps" / "log"), ("GPU-0",), binary="/bin/false")
        ctx = DispatchContext(root / "runs", POLICY, {}, mps=MpsState(control, {"GPU-0"}) if mps else None)
        # a b256 job of another program holds its peak: 10,709 MiB free, 14,560 + 2,457 needed
        snapshot = (GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=CARD_MIB, used_mib=B256_MIB,
                                free_mib=CARD_MIB - B256_MIB, processes=()),)  # fmt: skip
        recorder = _Recorder()
        for _ in range(passes):  # a later pass: the first trial is live, before step K
            schedule(store, snapshot, recorder, ctx, SchedulerState(), draining=False)
        return store, all_attempts(store), recorder

    store, attempts, _ = one_pass(tmp_path / "plain", mps=False)
    assert attempts == []  # without MPS nothing fences a trial: it waits
    store.close()
    store, attempts, recorder = one_pass(tmp_path / "mps", mps=True, passes=2)
    room = CARD_MIB - B256_MIB - HEADROOM_MIB
    assert [(a.reserved_mib, a.trial_fence_mib) for a in attempts] == [(room, room)]
    assert recorder.specs[0].env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={room}M"
    started = [e.message for e in events(store, "start")]
    assert "started on trial in 8.1 GiB, its MPS fence" in started[0]
    # the second seed waits for the first trial's peak, and is told so
    waiting = [j.wait_reason for j in read_jobs(store) if j.id != attempts[0].job_id]
    assert len(waiting) == 1 and waiting[0] is not None
    assert waiting[0].endswith("no start on trial until one of its kind started on trial shows its peak"), waiting
    store.close()


def test_the_sim_worker_holds_itself_to_its_mps_fence(tmp_path: Path) -> None:
    from workers.sim import SimAllocation, mps_fence_mib

    assert mps_fence_mib({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8252M"}) == 8252
    assert mps_fence_mib({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8G"}) == 8192
    assert mps_fence_mib({}) is None and mps_fence_mib({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "1=8G"}) is None
    fenced = SimAllocation(tmp_path / "gpu0", 24_576, fence_mib=8_000)
    assert fenced.allocate(7_000) is None
    said = fenced.allocate(1_500)  # the card has room; the fence has not
    assert said is not None and said.startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert SimAllocation(tmp_path / "gpu0", 24_576).allocate(8_500) is None  # unfenced: the card's room
