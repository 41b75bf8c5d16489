"""The deciding steps of a scheduling pass around `pack`, from values the pass read: each kind of
queued job's inputs (its prediction, host memory, run time, co-location curve, probing), the
jobs that start early to teach a prediction, and what each placement claims. No store, tmux or
clock: `orchestrator.scheduling.dispatch` reads, calls these, then writes. Prediction fills the
caches it is given as it goes (and reads a local model's config.json once, the first time it
meets that model); nothing else is read or written here."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field, replace

from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.prediction.durations import DurationTable
from orchestrator.prediction.fused_groups import (
    GroupPeak,
    fuse_group,
    fuse_max,
    learned_group_peaks,
    member_stack,
    member_work,
    shares_base,
)
from orchestrator.prediction.job_facts import (
    JobFacts,
    JobShapeCache,
    attempt_shape_key,
    job_host_settings,
    job_levels,
    model_info_of,
    peft_spec_of,
    shape_facts,
)
from orchestrator.prediction.job_prediction import predict_for
from orchestrator.prediction.ladder import Level, exact_levels_after, with_host_settings
from orchestrator.prediction.learned import Knowledge
from orchestrator.prediction.least import least_mib
from orchestrator.prediction.memory import estimated_base_mib
from orchestrator.prediction.startup import Startup, ahead_s, startup_key
from orchestrator.scheduling.family_inputs import curve_of, probe_family
from orchestrator.scheduling.packing.fused import ProcessChoice
from orchestrator.scheduling.packing.level_choice import LevelOption
from orchestrator.scheduling.packing.pack import PackingDecision
from orchestrator.scheduling.packing.types import QueuedJob, RunningAttempt
from orchestrator.scheduling.queue_kinds import Kind, kind_of
from orchestrator.scheduling.resources import predict_host_mib
from orchestrator.scheduling.teaching import untaught
from orchestrator.store.peak_source import PredictionSource
from orchestrator.store.rows import Attempt, Job, QueueEntry, ShapeMemory

Curve = Mapping[int, Mapping[int, float]]  # GPU index -> tenants -> relative throughput


@dataclass(frozen=True)
class PassReadings:
    """What the pass read of what orch has learned, for the queued jobs' inputs."""

    shapes: Mapping[str, ShapeMemory]  # shape key -> its measured memory
    prompt_lengths: Mapping[str, int]  # model and data -> the longest prompt a run reported
    knowledge: Knowledge
    durations: DurationTable
    curves: Mapping[str, Curve]  # shape key -> its co-location curve
    by_family: Mapping[str, Curve]  # memory family -> its curve
    host_shapes: Mapping[str, int]  # shape key -> the most host RAM (MiB) a finished attempt took
    host_running: Mapping[str, int]  # shape key -> the most host RAM (MiB) a live attempt holds
    startups: Mapping[str, Startup] = field(default_factory=dict)  # suite/config -> its learned start-up
    fused_caps: Mapping[str, int] = field(default_factory=dict)  # suite -> its fused groups' cap, once lowered
    # whether a card is fenced by MPS: only then may a job start on trial (its least is worked out)
    fenced: bool = False
    # shape keys with a live attempt started on trial before step K (prediction.learned.unproven_trials)
    unproven_trials: frozenset[str] = frozenset()


@dataclass(frozen=True)
class LaterLevel:
    """A later level reached through exact rungs that a kind's jobs may start at where it ends
    sooner: as `pack` weighs it, and what a claim there records."""

    option: LevelOption
    level: Level
    prediction: tuple[int, PredictionSource]


@dataclass(frozen=True)
class KindInputs:
    """What one pass works out once per kind of queued job."""

    prediction: tuple[int, PredictionSource]
    host_mib: int
    expected_s: float | None
    curve: Curve | None
    probe_family: str | None = None
    startup: Startup | None = None
    later: tuple[LaterLevel, ...] = ()
    fuse_group: str | None = None  # `share_base: fused`: its group (prediction.fused_groups)
    fuse_cap: int = 1
    group_peaks: tuple[GroupPeak, ...] = ()  # its shape's process peaks learned per group size
    fuse_work: float = 1.0  # what a member adds to each tick of its group (fused_groups.member_work)
    fuse_stack: str | None = None  # which members it stacks with (fused_groups.member_stack)
    estimated_base_mib: int | None = None  # its base's weights and context as the estimate counts them
    least_mib: int | None = None  # the least it could need: room for a start on trial (prediction.least)
    trial_held: bool = False  # no start on trial while one of its shape on trial is before step K
    margin_mib: int = 0  # its prediction's margin over a measured peak: within the headroom


@dataclass(frozen=True)
class PackInputs:
    """The queue as `pack` takes it, with what each job's claim records."""

    queue: list[QueuedJob]
    predictions: dict[int, tuple[int, PredictionSource]]  # job id -> predicted peak (MiB) and its source
    host_predictions: dict[int, int]  # job id -> host RAM (MiB) expected
    # per kind, in queue order: its first job, its untaught group (teaching), how many are queued
    firsts: list[tuple[int, str | None, int]]
    later: dict[int, tuple[LaterLevel, ...]] = field(default_factory=dict)  # job id -> its later exact levels


def pack_inputs(
    rows: Sequence[QueueEntry], facts_of: Mapping[int, JobFacts], readings: PassReadings, cache: JobShapeCache,
    queued_of_kind: Mapping[Kind, Sized] | None, waiting_since_s: Mapping[int, float] | None = None,
) -> PackInputs:
    """Each queued job as `pack` takes it; its kind's inputs are worked out once. A job without
    facts (its ladder was invalid) is left out. `queued_of_kind`: each kind's queued jobs, when
    the whole queue was read (teaching counts them); None when only the head was.
    `waiting_since_s`: job id -> when its wait began on the scale of the `now_s` given to `pack`,
    as the daemon measured it (orchestrator.scheduling.queue_waits); a job missing there counts
    from its stored `queued_at`."""
    since = waiting_since_s or {}
    queue: list[QueuedJob] = []
    predictions: dict[int, tuple[int, PredictionSource]] = {}
    host_predictions: dict[int, int] = {}
    kinds: dict[Kind, KindInputs] = {}
    firsts: list[tuple[int, str | None, int]] = []
    later: dict[int, tuple[LaterLevel, ...]] = {}
    for job in rows:
        facts = facts_of.get(job.id)
        if facts is None:
            continue
        kind = kind_of(facts, job)
        inputs = kinds.get(kind)
        if inputs is None:
            inputs = kinds[kind] = kind_inputs(facts, job, readings, cache)
            if queued_of_kind is not None:
                firsts.append((job.id, teaching_group(facts, inputs.prediction[1], readings.prompt_lengths),
                               len(queued_of_kind.get(kind, ())) or 1))
        predictions[job.id] = inputs.prediction
        host_predictions[job.id] = inputs.host_mib
        if inputs.later:
            later[job.id] = inputs.later
        queue.append(
            QueuedJob(
                job_id=job.id, priority=job.priority, queued_seq=job.id,
                predicted_peak_mib=inputs.prediction[0], waiting_since_s=since.get(job.id, job.queued_at),
                allowed_gpu_indices=facts.allowed, run_alone=facts.level.run_alone,
                expected_duration_s=inputs.expected_s, throughput_by_gpu=inputs.curve,
                min_stack_gain=facts.min_stack_gain,
                gpus=facts.gpus, host_mib=inputs.host_mib, cpus=facts.cpus, suite=job.suite, config=job.config_name,
                probe_family=inputs.probe_family,
                ahead_s=ahead_s(inputs.startup),
                startup_mib=inputs.startup.held_mib if inputs.startup else 0,
                alternatives=tuple(option.option for option in inputs.later), level=facts.level.index,
                fuse_group=inputs.fuse_group, fuse_cap=inputs.fuse_cap, group_peaks=inputs.group_peaks,
                fuse_work=inputs.fuse_work, fuse_stack=inputs.fuse_stack, estimated_base_mib=inputs.estimated_base_mib,
                least_mib=inputs.least_mib, trial_held=inputs.trial_held, margin_mib=inputs.margin_mib,
            )
        )
    return PackInputs(queue, predictions, host_predictions, firsts, later)


def kind_inputs(facts: JobFacts, job: QueueEntry, readings: PassReadings, cache: JobShapeCache) -> KindInputs:
    """One kind's prediction, host memory, expected run time, curve and probing family."""
    shape_key = facts.shape.shape_key
    predicted = predict_for(facts.shape, facts.shape.job, facts.level, readings.shapes, readings.prompt_lengths,
                            cache, readings.knowledge)
    host_mib, _ = predict_host_mib(readings.host_shapes.get(shape_key), readings.host_running.get(shape_key),
                                   facts.declared_host_mib)
    expected_s = readings.durations.expected_s(job.config_name, job.data, facts.level.index)
    whole = facts.shape.job  # a job of the kind: its config and suite settings
    group = fuse_group(whole, job.suite, facts.level.overrides, facts.level.run_alone)
    # a warm LoRA worker process was started with another attempt's fence: no trial into its room
    own_process = group is None and not shares_base(whole)
    # the least it could need, for a start on trial; held back (and told so) while one of its shape on
    # trial has not shown its peak, where it could start on trial at all
    least = least_mib(facts.shape, readings.shapes, readings.knowledge) if readings.fenced and own_process else None
    trial_held = least is not None and shape_key in readings.unproven_trials
    margin_mib = predicted[1].margin_within_headroom_mib(shared_base=not own_process)
    return KindInputs(
        predicted, host_mib, expected_s,
        curve_of(facts, readings.curves, readings.by_family), probe_family(facts, predicted[1], readings.knowledge),
        readings.startups.get(startup_key(job.suite, job.config_name)),
        later_levels(facts, job, readings, cache) if expected_s is not None and facts.gpus == 1 else (),
        group, fuse_max(whole, readings.fused_caps.get(job.suite)) if group is not None else 1,
        learned_group_peaks(shape_key, readings.shapes) if group is not None else (),
        *(_member_inputs(whole, facts.level.overrides, cache) if group is not None else (1.0, None, None)),
        None if trial_held else least, trial_held, margin_mib)


def _member_inputs(
    job: Job, overrides: Mapping[str, object], cache: JobShapeCache
) -> tuple[float, str | None, int | None]:
    """A fused member's work per tick, which members it stacks with, and its base's memory as the
    estimate counts it."""
    config = {**job.config, **overrides}
    spec = peft_spec_of(config, cache)
    return (member_work(config, spec), member_stack(config, spec),
            estimated_base_mib(config, model_info_of(config, cache)))


def with_group_peaks(running: list[RunningAttempt], live: Iterable[Attempt], live_jobs: Mapping[int, Job],
                     shapes: Mapping[str, ShapeMemory], cache: JobShapeCache,
                     snapshots: Iterable[GpuSnapshot]) -> list[RunningAttempt]:
    """The running fused members with their shapes' process peaks learned per group size and what
    their warm process (share.json's pid) holds on their card as the snapshot read it (what the
    packer reads where a job joins their process: orchestrator.scheduling.packing.fused)."""
    members = {r.job_id for r in running if r.fuse_group is not None}
    if not members:  # every pass comes here: nothing to read without a fused member
        return running
    held = {(s.index, p.pid): p.used_mib for s in snapshots for p in s.processes}
    peaks: dict[int, tuple[GroupPeak, ...]] = {}
    process: dict[int, int] = {}
    for attempt in live:
        job = live_jobs.get(attempt.job_id)
        if attempt.job_id not in members or job is None:
            continue
        found = learned_group_peaks(attempt_shape_key(job, attempt, cache), shapes)
        if found:
            peaks[attempt.job_id] = found
        reading = held.get((attempt.gpu_index, attempt.share_pid)) if attempt.share_pid is not None else None
        if reading is not None:
            process[attempt.job_id] = reading
    if not peaks and not process:
        return running
    return [replace(r, group_peaks=peaks.get(r.job_id, r.group_peaks), process_mib=process.get(r.job_id))
            if r.job_id in peaks or r.job_id in process else r for r in running]


def later_levels(
    facts: JobFacts, job: QueueEntry, readings: PassReadings, cache: JobShapeCache
) -> tuple[LaterLevel, ...]:
    """The later levels a kind's jobs reach through exact rungs only, each with its prediction and
    its run time where that is known (learned there, or learned at the job's level times the
    rungs' learned slowdown); a level whose run time is unknown is not offered."""
    whole = facts.shape.job  # a job of the kind: its config and ladder
    host = job_host_settings(whole)
    found = []
    for later in exact_levels_after(job_levels(whole, cache), facts.level.index):
        expected_s = readings.durations.expected_at_level_s(job.config_name, job.data, later.index, facts.level.index)
        if expected_s is None:
            continue
        at = with_host_settings(later, host)
        predicted = predict_for(shape_facts(whole, at, cache), whole, at, readings.shapes, readings.prompt_lengths,
                                cache, readings.knowledge)
        option = LevelOption(later.index, predicted[0], expected_s, exact=True, run_alone=at.run_alone)
        found.append(LaterLevel(option, at, predicted))
    return tuple(found)


def teaching_group(facts: JobFacts, source: PredictionSource, prompt_lengths: Mapping[str, int]) -> str | None:
    """A LoRA job's model and data while its prediction is untaught: one finished run of them
    reports the prompt lengths that size every config of that model and data."""
    shape = facts.shape
    if shape.job.worker != "lora" or not untaught(source, shape.length_key in prompt_lengths):
        return None
    return shape.length_key


def with_teaching(queue: list[QueuedJob], teaching: set[int]) -> list[QueuedJob]:
    """The queue with the jobs that start early to teach a prediction marked."""
    return [replace(q, teaches=True) if q.job_id in teaching else q for q in queue]


def host_running_peaks(live: Iterable[Attempt], live_jobs: Mapping[int, Job],
                       key_of: Callable[[Job, Attempt], str]) -> dict[str, int]:
    """Shape key -> the most host RAM (MiB) a live attempt of it holds."""
    peaks: dict[str, int] = {}
    for a in live:
        if a.job_id in live_jobs:
            key = key_of(live_jobs[a.job_id], a)
            peaks[key] = max(peaks.get(key, 0), a.host_peak_mib)
    return peaks


@dataclass(frozen=True)
class ClaimPlan:
    """What one placement's attempt records when it is claimed."""

    job_id: int
    level: Level
    gpu: GpuSnapshot  # its first card
    cards: tuple[GpuSnapshot, ...]  # all its cards, in CUDA_VISIBLE_DEVICES order
    predicted_mib: int
    source: PredictionSource
    reserved_mib: int
    host_mib: int
    level_note: str = ""  # set where it starts at a later level than its own (written before the claim)
    ahead: bool = False  # it starts ahead of the memory or slot it needs (--overlap)
    process: ProcessChoice | None = None  # `share_base: fused`: the process it was counted in
    trial_fence_mib: int | None = None  # a start on trial: the room it got and its MPS fence


def claim_plans(decision: PackingDecision, inputs: PackInputs, facts_of: Mapping[int, JobFacts],
                snapshots: Iterable[GpuSnapshot]) -> list[ClaimPlan]:
    """Each placement's claim, in the decision's order. A capped placement (its prediction was
    above every usable card) records the cap it was placed at, and says so in its source."""
    by_index = {s.index: s for s in snapshots}
    plans = []
    for placement in decision.placements:
        predicted_mib, source = inputs.predictions[placement.job_id]
        level = facts_of[placement.job_id].level
        if placement.level is not None:  # a later exact level that ends sooner
            chosen = next(x for x in inputs.later[placement.job_id] if x.option.level == placement.level)
            level, (predicted_mib, source) = chosen.level, chosen.prediction
        elif placement.capped:
            predicted_mib, source = placement.reserved_mib, source.with_cap()
        plans.append(ClaimPlan(
            placement.job_id, level, by_index[placement.gpu_index],
            tuple(by_index[i] for i in placement.all_gpus), predicted_mib, source, placement.reserved_mib,
            inputs.host_predictions[placement.job_id], placement.level_note, placement.ahead, placement.process,
            placement.trial_fence_mib))
    return plans
