"""One scheduling pass: queued jobs and live attempts from the store + GPU snapshots -> `pack`
-> attempts started. The policy itself is the pure `orchestrator.packing.pack`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.durations import CompletedRun, DurationTable
from orchestrator.errors import InvalidTransition, OrchError
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.ladder import HostSettings, Level, expand_levels, load_ladder, with_host_settings
from orchestrator.launch.base import Launcher
from orchestrator.launch.rundir import OUR_WORKERS
from orchestrator.launching import DispatchContext, claim, launch_all
from orchestrator.learned import Knowledge, running_peaks, throughput_curves
from orchestrator.lifecycle import JobState
from orchestrator.memory import (
    ModelInfo,
    ShapeMemory,
    at_learned_length,
    estimate_peak_mib,
    lookup_model_info,
    max_seq_len_of,
    model_info_from_hf_config,
    predict_peak_mib,
    prompt_length_key,
    shape_key,
)
from orchestrator.packing import (
    GpuState,
    PackingDecision,
    QueuedJob,
    can_take_any,
    headroom_mib,
    pack,
)
from orchestrator.plans import DEFAULT_SLOTS, GpuPlan
from orchestrator.plans.keymap import KeyMap
from orchestrator.plans.template import parse_template
from orchestrator.resources import host_state, predict_host_mib, running_attempts
from orchestrator.shapes import memory_hash
from orchestrator.store.attempts import (
    read_all_prompt_lengths,
    read_all_shapes,
)
from orchestrator.store.db import Store, now_s
from orchestrator.store.jobs import get_gpu_plan, transition
from orchestrator.store.learning import read_throughput
from orchestrator.store.queue import (
    jobs_by_id,
    live_attempt_rows,
    paused_suites,
    queued_jobs,
    succeeded_runs_since,
)
from orchestrator.store.resources import read_host_shapes

log = logging.getLogger(__name__)

PATH_KEYS = ("peft", "model", "data_dir")  # relative paths in a config are relative to its file


@dataclass
class ShapeFacts:
    """What a prediction needs, shared by the queued jobs that differ only by seed."""

    config: dict[str, Any]  # the job's config with the level's overrides, paths resolved
    shape_key: str
    length_key: str
    depends: tuple[Any, ...] | None = None  # what `prediction` was made from
    prediction: tuple[int, str] = (0, "")
    computed_for: Any = None  # the pass's Knowledge, for a prediction borrowed from a neighbour
    job: dict[str, Any] = field(default_factory=dict)  # a whole row of a job of this shape (its ladder)


@dataclass
class JobFacts:
    """A queued job's level and prediction inputs, valid while its level and host steps stay."""

    key: tuple[int, str]  # (level, host_steps_json)
    level: Level
    shape: ShapeFacts
    allowed: frozenset[int] | None
    gpus: int = 1  # a multi-GPU job's cards
    cpus: int | None = None  # cores the suite asks for
    declared_host_mib: int | None = None  # the config's host_mem_gib


@dataclass
class JobShapeCache:
    """Facts computed once per job or per shape and kept between passes: a pass over a long
    queue then redoes only what changed (a new level, a newly measured peak or prompt length)."""

    levels: dict[tuple[Any, ...], list[Level]] = field(default_factory=dict)  # by content
    model_info: dict[str, ModelInfo | None] = field(default_factory=dict)
    peft_specs: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    jobs: dict[int, JobFacts] = field(default_factory=dict)
    shapes: dict[tuple[Any, ...], ShapeFacts] = field(default_factory=dict)
    durations: DurationTable = field(default_factory=DurationTable)
    durations_seen: dict[int, float] = field(default_factory=dict)  # attempt id -> ended_at
    durations_after_s: float | None = None  # re-read succeeded attempts ended from here on


def config_hash(config: dict[str, Any]) -> str:
    """Hash of the config content that determines memory (seed and data excluded)."""
    content = {k: v for k, v in config.items() if k not in ("seed", "data")}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resolve_paths(config: dict[str, Any], config_path: str) -> dict[str, Any]:
    """Relative file paths in a config are written relative to the config file; the run dir's
    copy lives elsewhere, so make them absolute where the file exists."""
    resolved = dict(config)
    base = Path(config_path).parent
    for key in PATH_KEYS:
        value = resolved.get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            candidate = (base / value).resolve()
            if candidate.exists():
                resolved[key] = str(candidate)
    return resolved


def _model_info(config: dict[str, Any], cache: JobShapeCache) -> ModelInfo | None:
    model = config.get("model")
    if not isinstance(model, str):
        return None
    if model not in cache.model_info:
        info: ModelInfo | None = None
        config_json = Path(model) / "config.json"
        try:
            if config_json.is_file():
                info = model_info_from_hf_config(json.loads(config_json.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            info = None
        cache.model_info[model] = info or lookup_model_info(model)
    return cache.model_info[model]


def _peft_spec(config: dict[str, Any], cache: JobShapeCache) -> dict[str, Any] | None:
    peft = config.get("peft")
    if isinstance(peft, dict):
        return peft
    if not isinstance(peft, str):
        return None
    if peft not in cache.peft_specs:
        try:
            loaded = json.loads(Path(peft).read_text())
            cache.peft_specs[peft] = loaded if isinstance(loaded, dict) else None
        except (OSError, ValueError):
            cache.peft_specs[peft] = None
    return cache.peft_specs[peft]


def job_worker_output(row: Mapping[str, Any]) -> dict[str, Any]:
    """The suite's settings for its worker's output, stored with the job (`keys`,
    `progress_regex`, `result_regex`); {} for jobs queued before they existed."""
    try:
        stored = json.loads(row.get("worker_output_json") or "{}")
    except ValueError:
        return {}
    return stored if isinstance(stored, dict) else {}


def job_keys(job: Mapping[str, Any]) -> KeyMap:
    """The ladder knobs under the script's own key names (the suite's `keys:`)."""
    names = job_worker_output(job).get("keys") or {}
    return KeyMap({str(k): str(v) for k, v in names.items()} if isinstance(names, dict) else {})


def worker_reaches(job: Mapping[str, Any], keys: KeyMap) -> Callable[[str], bool] | None:
    """Which config changes (orch's key names) reach the job's worker; None: every one does (our
    workers and templates with {config} read the merged config.yaml)."""
    if job["worker"] in OUR_WORKERS:
        return None
    template = parse_template(job["worker"])
    if template.reads_config:
        return None
    return lambda key: template.reaches(keys.script_key(key))


def job_levels(job: dict[str, Any], cache: JobShapeCache) -> list[Level]:
    """The job's ladder levels, in orch's key names (`attempt_config` renames them). Keyed by
    content, not job id: a sweep's seeds share one ladder (and one entry)."""
    key = (job["ladder_json"] or "", _without_seed(job["config_json"]), int(job["one_token"]), job["worker"],
           job.get("worker_output_json") or "")
    levels = cache.levels.get(key)
    if levels is None:
        ladder = load_ladder(json.loads(job["ladder_json"]) if job["ladder_json"] else None)
        keys = job_keys(job)
        levels = cache.levels[key] = expand_levels(
            ladder, keys.to_orch(json.loads(job["config_json"])), bool(job["one_token"]), worker_reaches(job, keys)
        )
    return levels


def _without_seed(config_json: str) -> str:
    config = json.loads(config_json)
    return json.dumps({k: v for k, v in config.items() if k not in ("seed", "data")}, sort_keys=True, default=str)


def as_received(job: Mapping[str, Any], level: Level) -> Level:
    """`level` with its changes under the script's own key names, for messages."""
    keys = job_keys(job)
    if not keys.names:
        return level
    return Level(level.index, level.step, keys.to_script(level.overrides), keys.to_script(level.changes), level.run_alone)


def attempt_config(job: Mapping[str, Any], level: Level) -> dict[str, Any]:
    """The config an attempt at `level` runs with: the job's, with the level's overrides under
    the script's own key names, relative paths made absolute."""
    overrides = job_keys(job).to_script(level.overrides)
    return resolve_paths({**json.loads(job["config_json"]), **overrides}, job["config_path"])


def job_host_settings(job: dict[str, Any]) -> HostSettings:
    """The host-side steps the job took after host-RAM OOMs (none before the first)."""
    return HostSettings.from_records(json.loads(job["host_steps_json"] or "[]"))


def level_of(job: dict[str, Any], cache: JobShapeCache) -> Level:
    """What the job's next attempt runs with: its ladder level plus its host-side settings."""
    levels = job_levels(job, cache)
    return with_host_settings(levels[min(job["level"], len(levels) - 1)], job_host_settings(job))


def job_shape_key(job: dict[str, Any], level: Level) -> str:
    """The shape of the job's attempts at `level`: memory-relevant config keys (plus the
    suite's `memory_keys`, and the number of GPUs of a multi-GPU job), model, level index and task."""
    config = json.loads(job["config_json"])
    extra = json.loads(job.get("memory_keys_json") or "[]")
    gpus = int(job.get("gpus") or 1)
    if gpus > 1:  # a rank's peak depends on how the model is split: N is part of the shape
        config, extra = {**config, "gpus": gpus}, [*extra, "gpus"]
    foreign = job["worker"] not in OUR_WORKERS  # its memory keys are not known: all but the harmless
    return shape_key(memory_hash(config, extra, foreign=foreign), str(config.get("model", "")), level.index, job["data"])


def attempt_shape_key(job: dict[str, Any], attempt: Mapping[str, Any], cache: JobShapeCache) -> str:
    """The shape key of a (live) attempt: its job's shape at the attempt's level."""
    levels = job_levels(job, cache)
    return job_shape_key(job, levels[min(int(attempt["level"]), len(levels) - 1)])


def load_durations(store: Store) -> DurationTable:
    """Run times of succeeded attempts: longest expected jobs start first."""
    return refresh_durations(store, JobShapeCache())


# Attempts are ended by the daemon, one after another, so a succeeded attempt that ended more
# than this long before the latest one read is already in the table.
DURATIONS_OVERLAP_S = 60.0


def refresh_durations(store: Store, cache: JobShapeCache) -> DurationTable:
    """Add the attempts that succeeded since the last call to the cached run-time table."""
    since = None if cache.durations_after_s is None else cache.durations_after_s - DURATIONS_OVERLAP_S
    for r in succeeded_runs_since(store, since):
        if r["id"] in cache.durations_seen:
            continue
        cache.durations_seen[r["id"]] = r["ended_at"]
        cache.durations.add(CompletedRun(r["config_name"], r["data"], r["level"], r["duration_s"]))
        if cache.durations_after_s is None or r["ended_at"] > cache.durations_after_s:
            cache.durations_after_s = r["ended_at"]
    if cache.durations_after_s is not None and len(cache.durations_seen) > 1000:
        oldest_s = cache.durations_after_s - 2 * DURATIONS_OVERLAP_S
        cache.durations_seen = {k: v for k, v in cache.durations_seen.items() if v >= oldest_s}
    return cache.durations


def job_prompt_length_key(job: dict[str, Any]) -> str:
    return prompt_length_key(resolve_paths(json.loads(job["config_json"]), job["config_path"]), job["data"])


def predict(
    shapes: dict[str, ShapeMemory], job: dict[str, Any], level: Level, cache: JobShapeCache,
    prompt_lengths: Mapping[str, int] | None = None,
    knowledge: Knowledge | None = None,
) -> tuple[int, str]:
    return _predict(_shape_facts(job, level, cache), job, level, shapes, prompt_lengths or {}, cache, knowledge)


def _shape_facts(job: dict[str, Any], level: Level, cache: JobShapeCache) -> ShapeFacts:
    config = json.loads(job["config_json"])
    key = (
        config_hash(config), job["config_path"], job["data"], job["worker"], job["declared_mib"],
        level.index, json.dumps(level.overrides, sort_keys=True, default=str),
        job.get("worker_output_json") or "", job.get("memory_keys_json") or "",
    )
    facts = cache.shapes.get(key)
    if facts is None:
        resolved = attempt_config(job, level)
        facts = cache.shapes[key] = ShapeFacts(
            resolved, job_shape_key(job, level), prompt_length_key(resolved, job["data"]), job=dict(job)
        )
    return facts


def _predict(
    facts: ShapeFacts, job: Mapping[str, Any], level: Level, shapes: Mapping[str, ShapeMemory],
    prompt_lengths: Mapping[str, int], cache: JobShapeCache, knowledge: Knowledge | None,
) -> tuple[int, str]:
    """The job's prediction, recomputed only when its shape's measured memory, running peak or
    learned prompt length changed since the last time; a shape with none of its own (which
    borrows a neighbour's peak) once per pass."""
    key = facts.shape_key
    measured = shapes.get(key)
    learned = prompt_lengths.get(facts.length_key) if job["worker"] == "lora" else None
    running = knowledge.running.get(key) if knowledge is not None else None
    borrows = knowledge is not None and (measured is None or measured.peak_mib is None) and running is None
    depends = (measured, learned, running)
    if facts.depends == depends and (not borrows or facts.computed_for is knowledge):
        return facts.prediction
    config = facts.config
    estimated: int | None = None
    sized: Mapping[str, Any] = config
    if job["worker"] == "lora":
        sized = at_learned_length(config, learned)  # `config` itself when nothing applies
        estimated = estimate_peak_mib(sized, _model_info(config, cache), _peft_spec(config, cache))
    transfer = None
    if borrows and knowledge is not None:
        transfer = knowledge.transfer(
            key, _level_ratios(facts.job, level, cache, estimated, prompt_lengths),
            lambda task: prompt_lengths.get(prompt_length_key(config, task)),
        )
    prediction = predict_peak_mib(measured, estimated, int(job["declared_mib"]), running=running, transfer=transfer)
    result = (prediction.mib, prediction.source)
    if prediction.source == "estimate" and sized is not config:
        result = (prediction.mib, f"estimate at {max_seq_len_of(sized)} tokens")
    facts.depends, facts.prediction, facts.computed_for = depends, result, knowledge
    return result


def _level_ratios(
    job: dict[str, Any], level: Level, cache: JobShapeCache, estimated: int | None,
    prompt_lengths: Mapping[str, int] | None,
) -> dict[int, float] | None:
    """Estimate at `level` / estimate at each lower level (LoRA jobs): how much the rungs between
    save, applied to a peak measured at the lower level."""
    if estimated is None or level.index == 0:
        return None
    ratios: dict[int, float] = {}
    for lower in job_levels(job, cache)[: level.index]:
        config = resolve_paths({**json.loads(job["config_json"]), **lower.overrides}, job["config_path"])
        sized = at_learned_length(config, (prompt_lengths or {}).get(prompt_length_key(config, job["data"])))
        at_lower = estimate_peak_mib(sized, _model_info(config, cache), _peft_spec(config, cache))
        if at_lower:
            ratios[lower.index] = estimated / at_lower
    return ratios


def gpu_states(snapshots: tuple[GpuSnapshot, ...], plan: GpuPlan) -> list[GpuState]:
    return [
        GpuState(
            index=s.index, uuid=s.uuid, total_mib=s.total_mib, free_mib=s.free_mib,
            slots=plan.slots_for(s.index, DEFAULT_SLOTS),
        )
        for s in snapshots
    ]


def schedule(
    store: Store,
    snapshots: tuple[GpuSnapshot, ...],
    launcher: Launcher,
    ctx: DispatchContext,
    cache: JobShapeCache,
    *,
    draining: bool,
    hold: str | None = None,
) -> PackingDecision:
    """Pack the queue onto the GPUs and start what fits. Returns the decision (for tests).

    When no card has a free slot with free memory, only the head of the queue is read (for its
    waiting reasons): a long queue then costs nothing while it waits. `hold`: why nothing may
    start now (a full disk); every queued job shows it."""
    paused = paused_suites(store)
    live = live_attempt_rows(store)
    live_jobs = jobs_by_id(store, sorted({int(a["job_id"]) for a in live}))
    durations = refresh_durations(store, cache)
    # one RunningAttempt per card of a multi-GPU attempt, each with its expected end
    running = running_attempts(live, {s.uuid: s.index for s in snapshots}, _expected_end(live_jobs, durations))
    gpus = gpu_states(snapshots, get_gpu_plan(store))
    whole_queue = not draining and can_take_any(gpus, running, ctx.policy)
    queued_rows = queued_jobs(store, limit=None if whole_queue else ctx.policy.reasons_for)
    _learn_new_jobs(store, queued_rows, cache)
    reasons: dict[int, str] = {}
    queue: list[QueuedJob] = []
    shapes = read_all_shapes(store)
    prompt_lengths = read_all_prompt_lengths(store)
    knowledge = Knowledge(shapes, running_peaks(live, live_jobs, lambda j, a: attempt_shape_key(dict(j), a, cache)))
    curves = throughput_curves(read_throughput(store), {s.uuid: s.index for s in snapshots})
    host_shapes = read_host_shapes(store)
    host_running: dict[str, int] = {}
    for a in live:
        if a["job_id"] in live_jobs:
            key = attempt_shape_key(dict(live_jobs[a["job_id"]]), a, cache)
            host_running[key] = max(host_running.get(key, 0), int(a["host_peak_mib"] or 0))
    predictions: dict[int, tuple[int, str]] = {}
    host_predictions: dict[int, int] = {}
    # A prediction above every usable card (an inflated estimate or OOM floor) would keep a job
    # queued forever; capped, it runs on an empty card and the ladder takes over if it OOMs.
    ceiling_mib = max((g.total_mib - headroom_mib(g, ctx.policy) for g in gpus if g.slots > 0), default=None)
    for job in queued_rows:
        held_back = held_reason(job, paused, draining, hold)
        if held_back is not None:
            reasons[job["id"]] = held_back
            continue
        facts = cache.jobs.get(job["id"])
        if facts is None:  # an invalid ladder: failed by `_learn_new_jobs`
            continue
        predicted_mib, source = _predict(facts.shape, job, facts.level, shapes, prompt_lengths, cache, knowledge)
        if ceiling_mib is not None and predicted_mib > ceiling_mib:
            predicted_mib, source = ceiling_mib, f"{source}, capped at the largest card"
        predictions[job["id"]] = (predicted_mib, source)
        host_predictions[job["id"]], _ = predict_host_mib(
            host_shapes.get(facts.shape.shape_key), host_running.get(facts.shape.shape_key), facts.declared_host_mib)
        queue.append(
            QueuedJob(
                job_id=job["id"], priority=job["priority"], queued_seq=job["id"],
                predicted_peak_mib=predicted_mib, waiting_since_s=job["queued_at"],
                allowed_gpu_indices=facts.allowed, run_alone=facts.level.run_alone,
                expected_duration_s=durations.expected_s(job["config_name"], job["data"], facts.level.index),
                throughput_by_gpu=curves.get(facts.shape.shape_key),
                min_stack_gain=job.get("min_stack_gain"),
                gpus=facts.gpus, host_mib=host_predictions[job["id"]], cpus=facts.cpus,
            )
        )
    if whole_queue:  # forget jobs that left the queue, and shapes no queued job has
        queued_ids = {job["id"] for job in queued_rows}
        cache.jobs = {k: v for k, v in cache.jobs.items() if k in queued_ids}
        if len(cache.shapes) > 2 * len(cache.jobs) + 100:
            kept = {id(f.shape) for f in cache.jobs.values()}
            cache.shapes = {k: v for k, v in cache.shapes.items() if id(v) in kept}
    host = None
    if ctx.host is not None:
        cpus_of_job = {j["id"]: j.get("cpus") for j in live_jobs.values()}
        host = host_state(ctx.host.snapshot(), ctx.host_reserve_mib, live, cpus_of_job,
                          any(q.cpus is not None for q in queue))
    decision = pack(queue, gpus, running, ctx.policy, now_s(), host=host, topology=ctx.topology)
    reasons.update(decision.wait_reasons)
    placed = jobs_by_id(store, [p.job_id for p in decision.placements])
    by_index = {s.index: s for s in snapshots}
    claims = []
    for placement in decision.placements:
        predicted, source = predictions[placement.job_id]
        job, level = placed[placement.job_id], cache.jobs[placement.job_id].level
        # the attempt records its changes as the script receives them (the suite's `keys:`)
        claimed = claim(store, ctx, job, as_received(job, level), attempt_config(job, level),
                        by_index[placement.gpu_index], predicted, source, placement.reserved_mib,
                        tuple(by_index[i] for i in placement.all_gpus), host_predictions[placement.job_id])
        if claimed is not None:
            claims.append(claimed)
    launch_all(store, launcher, ctx, claims)
    explained = queued_rows if whole_queue else [r for r in queued_rows if r["id"] in reasons]
    _write_wait_reasons(store, explained, reasons, {p.job_id for p in decision.placements})
    return decision


def _expected_end(
    live_jobs: Mapping[int, Mapping[str, Any]], durations: DurationTable
) -> Callable[[Mapping[str, Any]], float | None]:
    """When a live attempt is expected to end: its start plus the learned run time of its kind."""
    def end(a: Mapping[str, Any]) -> float | None:
        job = live_jobs.get(a["job_id"])
        expected = durations.expected_s(job["config_name"], job["data"], int(a["level"])) if job else None
        return None if expected is None else float(a["started_at"]) + expected
    return end


def _declared_host_mib(job: Mapping[str, Any]) -> int | None:
    """The config's `host_mem_gib` (RAM of the whole process tree), when it gives a number."""
    value = json.loads(job["config_json"]).get("host_mem_gib")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 65536:
        return None
    return round(value * 1024)


def _learn_new_jobs(store: Store, rows: list[dict[str, Any]], cache: JobShapeCache) -> None:
    """Level and shape facts for jobs not seen before, or whose level or host steps changed;
    a job whose ladder cannot be expanded fails here."""
    stale = [r["id"] for r in rows if (f := cache.jobs.get(r["id"])) is None or f.key != (r["level"], r["host_steps_json"])]
    if not stale:
        return
    for job in jobs_by_id(store, stale).values():
        if job["state"] != JobState.QUEUED.value:
            continue
        try:
            level = level_of(job, cache)
        except OrchError as exc:
            cache.jobs.pop(job["id"], None)
            _fail_queued(store, job, f"invalid ladder: {exc}")
            continue
        allowed = json.loads(job["allowed_gpus_json"]) if job["allowed_gpus_json"] else None
        cache.jobs[job["id"]] = JobFacts(
            key=(job["level"], job["host_steps_json"]), level=level, shape=_shape_facts(job, level, cache),
            allowed=frozenset(allowed) if allowed is not None else None,
            gpus=int(job.get("gpus") or 1), cpus=job.get("cpus"), declared_host_mib=_declared_host_mib(job),
        )


def held_reason(job: Mapping[str, Any], paused: Container[str], draining: bool, hold: str | None) -> str | None:
    """Why no queued job of this kind may start on any executor now, or None."""
    if job["suite"] in paused:
        # The pause's cause is said once, on the suite (orch status); each job only points to it.
        return f"suite {job['suite']} is paused"
    if draining or hold:
        return hold or "daemon is draining: nothing new starts"
    return None


def _fail_queued(store: Store, job: dict[str, Any], reason: str) -> None:
    with contextlib.suppress(InvalidTransition):
        transition(store, job["id"], JobState.FAILED, message=f"failed: {reason}", kind="fail",
                   expect_from=[JobState.QUEUED], fields={"reason": reason})


def _write_wait_reasons(store: Store, rows: list[dict[str, Any]], reasons: dict[int, str], placed: set[int]) -> None:
    changed = [
        (reasons.get(r["id"]), r["id"]) for r in rows
        if r["id"] not in placed and reasons.get(r["id"]) != r["wait_reason"]
    ]
    if not changed:
        return
    with store.write():
        store.db.conn.executemany(
            "UPDATE jobs SET wait_reason = ? WHERE id = ? AND state = 'queued'", changed
        )
