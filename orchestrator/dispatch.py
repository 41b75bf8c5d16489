"""One scheduling pass: queued jobs and live attempts from the store + GPU snapshots -> `pack`
-> attempts started. The policy itself is the pure `orchestrator.packing.pack`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.durations import CompletedRun, DurationTable
from orchestrator.errors import InvalidTransition, OrchError
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.ladder import HostSettings, Level, expand_levels, load_ladder, with_host_settings
from orchestrator.launch.base import Launcher
from orchestrator.launching import DispatchContext, claim, launch_all
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
    RunningAttempt,
    can_take_any,
    headroom_mib,
    pack,
)
from orchestrator.plans import DEFAULT_SLOTS, GpuPlan
from orchestrator.store.attempts import (
    read_all_prompt_lengths,
    read_all_shapes,
)
from orchestrator.store.db import Store, now_s
from orchestrator.store.jobs import get_gpu_plan, transition
from orchestrator.store.queue import (
    jobs_by_id,
    live_attempt_rows,
    paused_suites,
    queued_jobs,
    succeeded_runs_since,
)

log = logging.getLogger(__name__)

PATH_KEYS = ("peft", "model", "data_dir")  # relative paths in a config are relative to its file


@dataclass
class ShapeFacts:
    """What a prediction needs, shared by the queued jobs that differ only by seed."""

    config: dict[str, Any]  # the job's config with the level's overrides, paths resolved
    shape_key: str
    length_key: str
    depends: tuple[ShapeMemory | None, int | None] | None = None  # what `prediction` was made from
    prediction: tuple[int, str] = (0, "")


@dataclass
class JobFacts:
    """A queued job's level and prediction inputs, valid while its level and host steps stay."""

    key: tuple[int, str]  # (level, host_steps_json)
    level: Level
    shape: ShapeFacts
    allowed: frozenset[int] | None


@dataclass
class JobShapeCache:
    """Facts computed once per job or per shape and kept between passes: a pass over a long
    queue then redoes only what changed (a new level, a newly measured peak or prompt length)."""

    levels: dict[tuple[str, str, int], list[Level]] = field(default_factory=dict)  # by content
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


def job_levels(job: dict[str, Any], cache: JobShapeCache) -> list[Level]:
    # Keyed by content, not job id: a sweep's seeds share one ladder (and one entry).
    key = (job["ladder_json"] or "", _without_seed(job["config_json"]), int(job["one_token"]))
    levels = cache.levels.get(key)
    if levels is None:
        ladder = load_ladder(json.loads(job["ladder_json"]) if job["ladder_json"] else None)
        levels = cache.levels[key] = expand_levels(ladder, json.loads(job["config_json"]), bool(job["one_token"]))
    return levels


def _without_seed(config_json: str) -> str:
    config = json.loads(config_json)
    return json.dumps({k: v for k, v in config.items() if k not in ("seed", "data")}, sort_keys=True, default=str)


def job_host_settings(job: dict[str, Any]) -> HostSettings:
    """The host-side steps the job took after host-RAM OOMs (none before the first)."""
    return HostSettings.from_records(json.loads(job["host_steps_json"] or "[]"))


def level_of(job: dict[str, Any], cache: JobShapeCache) -> Level:
    """What the job's next attempt runs with: its ladder level plus its host-side settings."""
    levels = job_levels(job, cache)
    return with_host_settings(levels[min(job["level"], len(levels) - 1)], job_host_settings(job))


def job_shape_key(job: dict[str, Any], level: Level) -> str:
    config = json.loads(job["config_json"])
    return shape_key(config_hash(config), str(config.get("model", "")), level.index, job["data"])


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
) -> tuple[int, str]:
    return _predict(_shape_facts(job, level, cache), job, shapes, prompt_lengths or {}, cache)


def _shape_facts(job: dict[str, Any], level: Level, cache: JobShapeCache) -> ShapeFacts:
    config = json.loads(job["config_json"])
    key = (
        config_hash(config), job["config_path"], job["data"], job["worker"], job["declared_mib"],
        level.index, json.dumps(level.overrides, sort_keys=True, default=str),
    )
    facts = cache.shapes.get(key)
    if facts is None:
        resolved = resolve_paths({**config, **level.overrides}, job["config_path"])
        facts = cache.shapes[key] = ShapeFacts(
            resolved, job_shape_key(job, level), prompt_length_key(resolved, job["data"])
        )
    return facts


def _predict(
    facts: ShapeFacts, job: Mapping[str, Any], shapes: Mapping[str, ShapeMemory],
    prompt_lengths: Mapping[str, int], cache: JobShapeCache,
) -> tuple[int, str]:
    """The job's prediction, recomputed only when its shape's measured memory or learned
    prompt length changed since the last time."""
    measured = shapes.get(facts.shape_key)
    learned = prompt_lengths.get(facts.length_key) if job["worker"] == "lora" else None
    if facts.depends is not None and facts.depends == (measured, learned):
        return facts.prediction
    config = facts.config
    estimated: int | None = None
    sized: Mapping[str, Any] = config
    if job["worker"] == "lora":
        sized = at_learned_length(config, learned)  # `config` itself when nothing applies
        estimated = estimate_peak_mib(sized, _model_info(config, cache), _peft_spec(config, cache))
    prediction = predict_peak_mib(measured, estimated, int(job["declared_mib"]))
    result = (prediction.mib, prediction.source)
    if prediction.source == "estimate" and sized is not config:
        result = (prediction.mib, f"estimate at {max_seq_len_of(sized)} tokens")
    facts.depends, facts.prediction = (measured, learned), result
    return result


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
) -> PackingDecision:
    """Pack the queue onto the GPUs and start what fits. Returns the decision (for tests).

    When no card has a free slot with free memory, only the head of the queue is read (for its
    waiting reasons): a long queue then costs nothing while it waits."""
    paused = paused_suites(store)
    live = live_attempt_rows(store)
    running = [
        RunningAttempt(
            job_id=a["job_id"], gpu_index=a["gpu_index"], predicted_peak_mib=a["predicted_peak_mib"],
            held_mib=a["held_mib"], reached_peak=bool(a["reached_peak"]), run_alone=bool(a["run_alone"]),
        )
        for a in live
    ]
    gpus = gpu_states(snapshots, get_gpu_plan(store))
    whole_queue = not draining and can_take_any(gpus, running, ctx.policy)
    queued_rows = queued_jobs(store, limit=None if whole_queue else ctx.policy.reasons_for)
    _learn_new_jobs(store, queued_rows, cache)
    reasons: dict[int, str] = {}
    queue: list[QueuedJob] = []
    shapes = read_all_shapes(store)
    prompt_lengths = read_all_prompt_lengths(store)
    durations = refresh_durations(store, cache)
    predictions: dict[int, tuple[int, str]] = {}
    # A prediction above every usable card (an inflated estimate or OOM floor) would keep a job
    # queued forever; capped, it runs on an empty card and the ladder takes over if it OOMs.
    ceiling_mib = max((g.total_mib - headroom_mib(g, ctx.policy) for g in gpus if g.slots > 0), default=None)
    for job in queued_rows:
        if job["suite"] in paused:
            reasons[job["id"]] = f"suite {job['suite']} paused: {paused[job['suite']]} (orch resume {job['suite']})"
            continue
        if draining:
            reasons[job["id"]] = "daemon is draining: nothing new starts"
            continue
        facts = cache.jobs.get(job["id"])
        if facts is None:  # an invalid ladder: failed by `_learn_new_jobs`
            continue
        predicted_mib, source = _predict(facts.shape, job, shapes, prompt_lengths, cache)
        if ceiling_mib is not None and predicted_mib > ceiling_mib:
            predicted_mib, source = ceiling_mib, f"{source}, capped at the largest card"
        predictions[job["id"]] = (predicted_mib, source)
        queue.append(
            QueuedJob(
                job_id=job["id"], priority=job["priority"], queued_seq=job["id"],
                predicted_peak_mib=predicted_mib, waiting_since_s=job["queued_at"],
                allowed_gpu_indices=facts.allowed, run_alone=facts.level.run_alone,
                expected_duration_s=durations.expected_s(job["config_name"], job["data"], facts.level.index),
            )
        )
    if whole_queue:  # forget jobs that left the queue, and shapes no queued job has
        queued_ids = {job["id"] for job in queued_rows}
        cache.jobs = {k: v for k, v in cache.jobs.items() if k in queued_ids}
        if len(cache.shapes) > 2 * len(cache.jobs) + 100:
            kept = {id(f.shape) for f in cache.jobs.values()}
            cache.shapes = {k: v for k, v in cache.shapes.items() if id(v) in kept}
    decision = pack(queue, gpus, running, ctx.policy, now_s())
    reasons.update(decision.wait_reasons)
    placed = jobs_by_id(store, [p.job_id for p in decision.placements])
    by_index = {s.index: s for s in snapshots}
    claims = []
    for placement in decision.placements:
        predicted, source = predictions[placement.job_id]
        job, level = placed[placement.job_id], cache.jobs[placement.job_id].level
        config = resolve_paths({**json.loads(job["config_json"]), **level.overrides}, job["config_path"])
        claimed = claim(store, ctx, job, level, config, by_index[placement.gpu_index], predicted, source,
                        placement.reserved_mib)
        if claimed is not None:
            claims.append(claimed)
    launch_all(store, launcher, ctx, claims)
    explained = queued_rows if whole_queue else [r for r in queued_rows if r["id"] in reasons]
    _write_wait_reasons(store, explained, reasons, {p.job_id for p in decision.placements})
    return decision


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
        )


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
