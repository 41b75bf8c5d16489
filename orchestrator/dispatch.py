"""One scheduling pass: queued jobs and live attempts from the store + GPU snapshots -> `pack`
-> attempts started. The policy itself is the pure `orchestrator.packing.pack`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from orchestrator.diskspace import is_disk_full_error
from orchestrator.durations import CompletedRun, DurationTable
from orchestrator.errors import InvalidTransition, LauncherError, OrchError
from orchestrator.gpu.host import HostProbe
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.ladder import HostSettings, Level, expand_levels, load_ladder, with_host_settings
from orchestrator.launch.base import Launcher, LaunchSpec
from orchestrator.launch.rundir import OUR_WORKERS, build_argv, build_worker_env, prepare_run_dir
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
    PackingPolicy,
    QueuedJob,
    headroom_mib,
    pack,
)
from orchestrator.plans import DEFAULT_SLOTS, GpuPlan
from orchestrator.plans.keymap import KeyMap
from orchestrator.plans.template import parse_template
from orchestrator.resources import free_port, host_state, predict_host_mib, running_attempts
from orchestrator.shapes import memory_hash
from orchestrator.store.attempts import (
    AttemptPlan,
    read_all_prompt_lengths,
    read_all_shapes,
    start_attempt,
    update_attempt,
)
from orchestrator.store.db import Store, now_s
from orchestrator.store.jobs import get_gpu_plan, transition
from orchestrator.store.learning import read_throughput
from orchestrator.store.resources import live_ports, read_host_shapes

log = logging.getLogger(__name__)

PATH_KEYS = ("peft", "model", "data_dir")  # relative paths in a config are relative to its file


@dataclass
class JobShapeCache:
    """Per-job facts that do not change while the daemon runs (levels, model size)."""

    levels: dict[int, list[Level]] = field(default_factory=dict)
    model_info: dict[str, ModelInfo | None] = field(default_factory=dict)
    peft_specs: dict[str, dict[str, Any] | None] = field(default_factory=dict)


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
    """The job's ladder levels, in orch's key names (`attempt_overrides` renames them)."""
    if job["id"] not in cache.levels:
        ladder = load_ladder(json.loads(job["ladder_json"]) if job["ladder_json"] else None)
        keys = job_keys(job)
        cache.levels[job["id"]] = expand_levels(
            ladder, keys.to_orch(json.loads(job["config_json"])), bool(job["one_token"]), worker_reaches(job, keys)
        )
    return cache.levels[job["id"]]


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
    """Run times of succeeded attempts, read once per pass: longest expected jobs start first."""
    rows = store.query(
        "SELECT j.config_name, j.data, a.level, a.ended_at - a.started_at AS duration_s"
        " FROM attempts a JOIN jobs j ON j.id = a.job_id"
        " WHERE a.outcome = 'succeeded' AND a.ended_at IS NOT NULL"
    )
    return DurationTable(
        CompletedRun(r["config_name"], r["data"], r["level"], r["duration_s"]) for r in rows
    )


def job_prompt_length_key(job: dict[str, Any]) -> str:
    return prompt_length_key(resolve_paths(json.loads(job["config_json"]), job["config_path"]), job["data"])


def predict(
    shapes: dict[str, ShapeMemory], job: dict[str, Any], level: Level, cache: JobShapeCache,
    prompt_lengths: Mapping[str, int] | None = None,
    knowledge: Knowledge | None = None,
) -> tuple[int, str]:
    config = attempt_config(job, level)
    key = job_shape_key(job, level)
    measured = shapes.get(key)
    estimated: int | None = None
    sized: Mapping[str, Any] = config
    if job["worker"] == "lora":
        learned = (prompt_lengths or {}).get(prompt_length_key(config, job["data"]))
        sized = at_learned_length(config, learned)  # `config` itself when nothing applies
        estimated = estimate_peak_mib(sized, _model_info(config, cache), _peft_spec(config, cache))
    running = knowledge.running.get(key) if knowledge is not None else None
    transfer = None
    if knowledge is not None and (measured is None or measured.peak_mib is None) and running is None:
        transfer = knowledge.transfer(
            key, _level_ratios(job, level, cache, estimated, prompt_lengths),
            lambda task: (prompt_lengths or {}).get(prompt_length_key(config, task)),
        )
    prediction = predict_peak_mib(measured, estimated, int(job["declared_mib"]), running=running, transfer=transfer)
    if prediction.source == "estimate" and sized is not config:
        return prediction.mib, f"estimate at {max_seq_len_of(sized)} tokens"
    return prediction.mib, prediction.source


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


@dataclass(frozen=True)
class DispatchContext:
    runs_dir: Path
    policy: PackingPolicy
    worker_env: dict[str, str]  # injected into every attempt on top of the per-attempt env
    host: HostProbe | None = None  # host RAM and cores; None: not looked at
    host_reserve_mib: int = 2048  # kept free of jobs (--host-reserve-gib)
    topology: Mapping[tuple[int, int], int] | None = None  # card distances, read once at start


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80]


def run_dir_for(ctx: DispatchContext, job: dict[str, Any], n: int) -> Path:
    job_dir = f"{job['id']:06d}-{_safe_name(job['config_name'])}-s{job['seed']}-{_safe_name(job['data'])}"
    return ctx.runs_dir / _safe_name(job["suite"]) / job_dir / f"attempt-{n}"


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
    `hold`: why nothing may start now (a full disk); every queued job shows it."""
    paused = {r["suite"]: r["reason"] for r in store.query("SELECT suite, reason FROM paused_suites")}
    queued_rows = store.query("SELECT * FROM jobs WHERE state = 'queued' ORDER BY priority DESC, id")
    live = store.query("SELECT * FROM attempts WHERE outcome IS NULL")
    reasons: dict[int, str] = {}
    queue: list[QueuedJob] = []
    levels: dict[int, Level] = {}
    shapes = read_all_shapes(store)
    prompt_lengths = read_all_prompt_lengths(store)
    live_jobs = {j["id"]: j for j in store.query(
        "SELECT * FROM jobs WHERE id IN (SELECT job_id FROM attempts WHERE outcome IS NULL)")}
    knowledge = Knowledge(shapes, running_peaks(live, live_jobs, lambda j, a: attempt_shape_key(dict(j), a, cache)))
    curves = throughput_curves(read_throughput(store), {s.uuid: s.index for s in snapshots})
    durations = load_durations(store)
    running = running_attempts(live, {s.uuid: s.index for s in snapshots}, _expected_end(live_jobs, durations))
    host_shapes = read_host_shapes(store)
    host_running: dict[str, int] = {}
    for a in live:
        if a["job_id"] in live_jobs:
            key = attempt_shape_key(dict(live_jobs[a["job_id"]]), a, cache)
            host_running[key] = max(host_running.get(key, 0), int(a["host_peak_mib"] or 0))
    predictions: dict[int, tuple[int, str]] = {}
    host_predictions: dict[int, int] = {}
    gpus = gpu_states(snapshots, get_gpu_plan(store))
    # A prediction above every usable card (an inflated estimate or OOM floor) would keep a job
    # queued forever; capped, it runs on an empty card and the ladder takes over if it OOMs.
    ceiling_mib = max((g.total_mib - headroom_mib(g, ctx.policy) for g in gpus if g.slots > 0), default=None)
    for job in queued_rows:
        if job["suite"] in paused:
            # The pause's cause is said once, on the suite (orch status); each job only points to it.
            reasons[job["id"]] = f"suite {job['suite']} is paused"
            continue
        if draining or hold:
            reasons[job["id"]] = hold or "daemon is draining: nothing new starts"
            continue
        try:
            level = level_of(job, cache)
        except OrchError as exc:
            _fail_queued(store, job, f"invalid ladder: {exc}")
            continue
        levels[job["id"]] = level
        predicted_mib, source = predict(shapes, job, level, cache, prompt_lengths, knowledge)
        if ceiling_mib is not None and predicted_mib > ceiling_mib:
            predicted_mib, source = ceiling_mib, f"{source}, capped at the largest card"
        predictions[job["id"]] = (predicted_mib, source)
        allowed = json.loads(job["allowed_gpus_json"]) if job["allowed_gpus_json"] else None
        key = job_shape_key(job, level)
        host_predictions[job["id"]], _ = predict_host_mib(
            host_shapes.get(key), host_running.get(key), _declared_host_mib(job))
        queue.append(
            QueuedJob(
                job_id=job["id"], priority=job["priority"], queued_seq=job["id"],
                predicted_peak_mib=predictions[job["id"]][0], waiting_since_s=job["queued_at"],
                allowed_gpu_indices=frozenset(allowed) if allowed is not None else None,
                run_alone=level.run_alone,
                expected_duration_s=durations.expected_s(job["config_name"], job["data"], level.index),
                throughput_by_gpu=curves.get(job_shape_key(job, level)),
                min_stack_gain=job.get("min_stack_gain"),
                gpus=int(job.get("gpus") or 1), host_mib=host_predictions[job["id"]], cpus=job.get("cpus"),
            )
        )
    host = None
    if ctx.host is not None:
        cpus_of_job = {j["id"]: j.get("cpus") for j in live_jobs.values()}
        host = host_state(ctx.host.snapshot(), ctx.host_reserve_mib, live, cpus_of_job,
                          any(q.cpus is not None for q in queue))
    decision = pack(queue, gpus, running, ctx.policy, now_s(), host=host, topology=ctx.topology)
    reasons.update(decision.wait_reasons)
    by_id = {job["id"]: job for job in queued_rows}
    by_index = {s.index: s for s in snapshots}
    for placement in decision.placements:
        job = by_id[placement.job_id]
        predicted, source = predictions[placement.job_id]
        cards = [by_index[i] for i in placement.all_gpus]
        _launch(store, launcher, ctx, job, levels[job["id"]], cards, predicted, source, placement.reserved_mib,
                host_predictions[job["id"]])
    _write_wait_reasons(store, queued_rows, reasons, {p.job_id for p in decision.placements})
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


def _launch(
    store: Store,
    launcher: Launcher,
    ctx: DispatchContext,
    job: dict[str, Any],
    level: Level,
    cards: list[GpuSnapshot],
    predicted_mib: int,
    source: str,
    reserved_mib: int,
    host_mib: int = 0,
) -> None:
    keys = job_keys(job)  # the attempt records its changes as the script receives them
    gpu = cards[0]
    uuids = tuple(c.uuid for c in cards)
    port = free_port(live_ports(store))
    plan = AttemptPlan(
        job_id=job["id"], gpu_index=gpu.index, gpu_uuid=gpu.uuid, level=level.index,
        level_step=level.step, changes=keys.to_script(level.changes), overrides=keys.to_script(level.overrides),
        run_alone=level.run_alone, predicted_peak_mib=predicted_mib, prediction_source=source,
        reserved_mib=reserved_mib, gpu_uuids=uuids if len(uuids) > 1 else (), port=port, predicted_host_mib=host_mib,
    )
    try:
        attempt = start_attempt(store, plan, lambda n: run_dir_for(ctx, job, n))
    except InvalidTransition:
        return  # cancelled between the read and the claim
    run_dir = Path(attempt["run_dir"])
    config = attempt_config(job, level)
    try:
        env = build_worker_env(
            gpu_uuid=",".join(uuids), gpu_index=gpu.index, seed=job["seed"],
            suite_env=json.loads(job["env_json"]),
            extra={**ctx.worker_env, "ORCH_JOB_ID": str(job["id"]), "ORCH_ATTEMPT": str(attempt["n"]),
                   "ORCH_RUN_DIR": str(run_dir)},
        )
        prepare_run_dir(run_dir, config, env)
        argv = build_argv(
            job["worker"], config_path=run_dir / "config.yaml", run_dir=run_dir,
            values={"seed": str(job["seed"]), "data": job["data"], "job": str(job["id"]),
                    "nproc": str(len(uuids)), "port": str(port)}, config=config,
        )
        handle = launcher.launch(
            LaunchSpec(job_id=job["id"], attempt_id=attempt["id"], window_name=f"job{job['id']}-{_safe_name(job['config_name'])[:30]}",
                       argv=argv, env=env, run_dir=run_dir)  # the launcher puts the wrapper in front
        )
    except (OSError, ValueError, OrchError, LauncherError) as exc:  # ValueError: a NUL in an argument
        from orchestrator.outcomes import fail_before_start

        full = is_disk_full_error(exc)
        fail_before_start(store, attempt, f"{'disk full: ' if full else ''}could not start: {exc}", disk_full=full)
        return
    # The launcher's pid and the create time read now are what later proves which process
    # group is this attempt's; nothing the worker writes can change them.
    update_attempt(store, attempt["id"], launcher=handle.launcher, window_id=handle.window_id, pid=handle.pid,
                   proc_create_time=_create_time(handle.pid))


def _create_time(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None
