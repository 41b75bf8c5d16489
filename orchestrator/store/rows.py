"""Typed rows: a job or an attempt as the code above the store sees it. Built once from a row,
with every JSON column parsed once (a bad value reads as empty, never raises), and the states
as enums. Rows are snapshots: writes go through the store's functions, which return fresh ones."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.lifecycle import AttemptOutcome, JobState, KillRequest
from orchestrator.store.json_columns import json_column as _json


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _priority(value: Any) -> int:
    """A stored priority; one that is not a number (written by hand, or before submit checked
    it) reads as 0, so a reader never fails on it: the next pass fails its job."""
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return value if isinstance(value, int) else 0


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class Job:
    id: int
    identity: str
    suite: str
    config_name: str
    config_path: str
    config_json: str  # kept as stored: the shape caches key on its text
    seed: int
    data: str
    worker: str
    declared_mib: int
    priority: int
    state: JobState
    level: int
    attempt_count: int
    max_attempts: int
    one_token: bool
    hang_timeout_s: float
    queued_at: float
    created_at: float
    updated_at: float
    crash_loop_failures: int
    crash_loop_within_s: float
    crash_loop_window_s: float
    gpus: int
    config: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    allowed_gpus: frozenset[int] | None = None
    ladder_json: str | None = None
    reason: str | None = None
    wait_reason: str | None = None
    level_note: str | None = None  # why it starts above the level its ladder gave it
    host_steps_json: str = "[]"
    worker_output: dict[str, Any] = field(default_factory=dict)
    worker_output_json: str = "{}"
    memory_keys: tuple[str, ...] = ()
    memory_keys_json: str = "[]"
    min_stack_gain: float | None = None
    slurm: dict[str, Any] = field(default_factory=dict)
    cpus: int | None = None
    fresh_after_attempt: int = 0  # attempts up to this n are never resumed from (orch retry --fresh)
    early_stop: dict[str, Any] = field(default_factory=dict)  # the suite's early_stop rule ({}: none)
    pruned: dict[str, Any] = field(default_factory=dict)  # why early stopping stopped it ({}: it did not)
    search: dict[str, Any] = field(default_factory=dict)  # its search trial: {spec, trial, max_attempts}
    max_resumes: int = 8  # deaths with a checkpoint left it may resume from without counting
    resumes: int = 0  # such resumes so far (since submit or the user's last retry)

    @property
    def counted_attempts(self) -> int:
        """Its attempts that use up one of `max_attempts` (its resumes do not)."""
        return self.attempt_count - self.resumes

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Job:
        allowed = _json(row.get("allowed_gpus_json"), None if not row.get("allowed_gpus_json") else [])
        return cls(
            id=int(row["id"]), identity=row["identity"], suite=row["suite"], config_name=row["config_name"],
            config_path=row["config_path"], config_json=row["config_json"], seed=int(row["seed"]),
            data=row["data"], worker=row["worker"], declared_mib=int(row["declared_mib"]),
            priority=_priority(row["priority"]), state=JobState(row["state"]), level=int(row["level"]),
            attempt_count=int(row["attempt_count"]), max_attempts=int(row["max_attempts"]),
            one_token=bool(row["one_token"]), hang_timeout_s=float(row["hang_timeout_s"]),
            queued_at=float(row["queued_at"]), created_at=float(row["created_at"]),
            updated_at=float(row["updated_at"]), crash_loop_failures=int(row["crash_loop_failures"]),
            crash_loop_within_s=float(row["crash_loop_within_s"]),
            crash_loop_window_s=float(row["crash_loop_window_s"]), gpus=int(row.get("gpus") or 1),
            config=_json(row["config_json"], {}), overrides=_json(row.get("overrides_json"), {}),
            env={str(k): str(v) for k, v in _json(row.get("env_json"), {}).items()},
            allowed_gpus=None if allowed is None else frozenset(int(i) for i in allowed),
            ladder_json=row.get("ladder_json"), reason=row.get("reason"), wait_reason=row.get("wait_reason"),
            level_note=row.get("level_note"),
            host_steps_json=row.get("host_steps_json") or "[]",
            worker_output=_json(row.get("worker_output_json"), {}),
            worker_output_json=row.get("worker_output_json") or "{}",
            memory_keys=tuple(str(k) for k in _json(row.get("memory_keys_json"), [])),
            memory_keys_json=row.get("memory_keys_json") or "[]",
            min_stack_gain=_opt_float(row.get("min_stack_gain")), slurm=_json(row.get("slurm_json"), {}),
            cpus=_opt_int(row.get("cpus")), fresh_after_attempt=int(row.get("fresh_after_attempt") or 0),
            early_stop=_json(row.get("early_stop_json"), {}), pruned=_json(row.get("pruned_json"), {}),
            search=_json(row.get("search_json"), {}),
            max_resumes=int(row.get("max_resumes", 8)), resumes=int(row.get("resumes") or 0),
        )


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """What a scheduling pass reads of every queued job (the light columns); the whole `Job`
    is read only for jobs the scheduler has not seen."""

    id: int
    suite: str
    priority: int
    level: int
    host_steps_json: str
    queued_at: float
    config_name: str
    data: str
    wait_reason: str | None

    COLUMNS = "id, suite, priority, level, host_steps_json, queued_at, config_name, data, wait_reason"

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> QueueEntry:
        return cls(
            id=int(row["id"]), suite=row["suite"], priority=_priority(row["priority"]), level=int(row["level"]),
            host_steps_json=row.get("host_steps_json") or "[]", queued_at=float(row["queued_at"]),
            config_name=row["config_name"], data=row["data"], wait_reason=row.get("wait_reason"),
        )

    @classmethod
    def from_values(cls, values: tuple[Any, ...]) -> QueueEntry:
        """From a row selected as COLUMNS, in that order. The texts seeds share are interned:
        a daemon keeps tens of thousands of these between passes."""
        job_id, suite, priority, level, host_steps, queued_at, config_name, data, wait_reason = values
        return cls(
            id=int(job_id), suite=sys.intern(suite), priority=_priority(priority), level=int(level),
            host_steps_json=sys.intern(host_steps or "[]"), queued_at=float(queued_at),
            config_name=sys.intern(config_name), data=sys.intern(data), wait_reason=wait_reason,
        )


@dataclass(frozen=True)
class Attempt:
    id: int
    job_id: int
    n: int
    gpu_index: int
    gpu_uuid: str
    level: int
    run_dir: str
    predicted_peak_mib: int
    prediction_source: str
    reserved_mib: int
    held_mib: int
    peak_mib: int
    reached_peak: bool
    started_at: float
    run_alone: bool
    predicted_host_mib: int
    host_held_mib: int
    host_peak_mib: int
    level_step: str | None = None
    changes: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    pid: int | None = None
    pgid: int | None = None
    proc_create_time: float | None = None
    last_progress_at: float | None = None
    progress: dict[str, Any] = field(default_factory=dict)
    ended_at: float | None = None
    outcome: AttemptOutcome | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    kill_requested: KillRequest | None = None
    output_metrics: dict[str, Any] = field(default_factory=dict)
    executor: str | None = None
    executor_id: str | None = None
    executor_state: str | None = None
    gpu_uuids: tuple[str, ...] = ()
    held_by_gpu: dict[str, int] = field(default_factory=dict)
    peak_by_gpu: dict[str, int] = field(default_factory=dict)
    peak_by_rank: dict[str, Any] = field(default_factory=dict)  # worker pid -> {gpu, mib}
    port: int | None = None
    cpu_peak_cores: float | None = None
    resumed_from_attempt: int | None = None  # the earlier attempt whose checkpoint it resumed from
    resumed_from_checkpoint: str | None = None
    hunted: str | None = None  # processes outside its group ended at its end (attempts.containment)
    token: str | None = None  # this attempt's own, in its exit.json and our workers' result.json
    loss: dict[str, Any] = field(default_factory=dict)  # the loss summary its end was judged on
    diverged: str | None = None  # why the divergence rule flagged it
    provenance: dict[str, Any] = field(default_factory=dict)  # the validated digest of provenance.json
    sm_pct: int | None = None  # its share of its card's SMs now (NVML per process); None: not known
    # what its share.json said (a warm LoRA worker process trains its job): sequential or fused,
    # the process (`<key16>-<slot>`) and its pid, the base's resident MiB; None: none read
    share_mode: str | None = None
    share_process: str | None = None
    share_pid: int | None = None
    share_base_mib: int | None = None
    # the first training step the daemon saw it report, and when (wall clock): its own pace
    # counts from there (orchestrator.prediction.startup.remaining_s); None: not seen
    first_step: int | None = None
    first_step_at: float | None = None
    # `share_base: fused`: the process the daemon placed it in, named by the id of the attempt
    # whose placement opened it (its own where it opened one); None: not a fused member
    fuse_process: int | None = None
    # a start on trial (--mps): the room it was started into, less than its prediction asked, and
    # its MPS fence (orchestrator.scheduling.packing.trial); None: an ordinary start
    trial_fence_mib: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Attempt:
        return cls(
            id=int(row["id"]),
            job_id=int(row["job_id"]),
            n=int(row["n"]),
            gpu_index=int(row["gpu_index"]),
            gpu_uuid=row["gpu_uuid"],
            level=int(row["level"]),
            run_dir=row["run_dir"],
            predicted_peak_mib=int(row["predicted_peak_mib"]),
            prediction_source=row["prediction_source"],
            reserved_mib=int(row["reserved_mib"]),
            held_mib=int(row["held_mib"]),
            peak_mib=int(row["peak_mib"]),
            reached_peak=bool(row["reached_peak"]),
            started_at=float(row["started_at"]),
            run_alone=bool(row["run_alone"]),
            predicted_host_mib=int(row["predicted_host_mib"]),
            host_held_mib=int(row["host_held_mib"]),
            host_peak_mib=int(row["host_peak_mib"]),
            level_step=row.get("level_step"),
            changes=_json(row.get("changes_json"), {}),
            overrides=_json(row.get("overrides_json"), {}),
            pid=_opt_int(row.get("pid")),
            pgid=_opt_int(row.get("pgid")),
            proc_create_time=_opt_float(row.get("proc_create_time")),
            last_progress_at=_opt_float(row.get("last_progress_at")),
            progress=_json(row.get("progress_json"), {}),
            ended_at=_opt_float(row.get("ended_at")),
            outcome=AttemptOutcome(row["outcome"]) if row.get("outcome") else None,
            exit_code=_opt_int(row.get("exit_code")),
            signal=_opt_int(row.get("signal")),
            reason=row.get("reason"),
            kill_requested=KillRequest(row["kill_requested"])
            if row.get("kill_requested")
            else None,
            output_metrics=_json(row.get("output_metrics_json"), {}),
            executor=row.get("executor"),
            executor_id=row.get("executor_id"),
            executor_state=row.get("executor_state"),
            gpu_uuids=tuple(str(u) for u in _json(row.get("gpu_uuids_json"), [])),
            held_by_gpu=_json(row.get("held_by_gpu_json"), {}),
            peak_by_gpu=_json(row.get("peak_by_gpu_json"), {}),
            peak_by_rank=_json(row.get("peak_by_rank_json"), {}),
            port=_opt_int(row.get("port")),
            cpu_peak_cores=_opt_float(row.get("cpu_peak_cores")),
            resumed_from_attempt=_opt_int(row.get("resumed_from_attempt")),
            resumed_from_checkpoint=row.get("resumed_from_checkpoint"),
            hunted=row.get("hunted"),
            token=row.get("token"),
            loss=_json(row.get("loss_json"), {}),
            diverged=row.get("diverged"),
            provenance=_json(row.get("provenance_json"), {}),
            sm_pct=_opt_int(row.get("sm_pct")),
            share_mode=row.get("share_mode"),
            share_process=row.get("share_process"),
            share_pid=_opt_int(row.get("share_pid")),
            share_base_mib=_opt_int(row.get("share_base_mib")),
            first_step=_opt_int(row.get("first_step")),
            first_step_at=_opt_float(row.get("first_step_at")),
            fuse_process=_opt_int(row.get("fuse_process")),
            trial_fence_mib=_opt_int(row.get("trial_fence_mib")),
        )

    @property
    def live(self) -> bool:
        return self.ended_at is None

    @property
    def cards(self) -> tuple[str, ...]:
        """Every card of the attempt, in CUDA_VISIBLE_DEVICES order (one for a one-GPU attempt)."""
        return self.gpu_uuids or (self.gpu_uuid,)


@dataclass(frozen=True)
class ShapeMemory:
    peak_mib: int | None  # max measured peak over completed attempts of this shape
    oom_floor_mib: int | None  # least it is known to need: held at an OOM, or seen before dying
    samples: int = 0  # completed attempts behind peak_mib
    disproved_mib: int | None = None  # the most an OOM'd attempt of it was placed at


@dataclass(frozen=True)
class FamilyTag:
    """Where one shape sits in its family."""

    family_key: str
    batch_size: int
    tokens: int | None  # the sequence length it is sized at, where known
    task: str
