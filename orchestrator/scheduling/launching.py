"""Starting the workers of attempts a scheduling pass placed: claim each in the store, then
write its run dir and ask the executor, several at once."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.attempts.containment import tracking_env
from orchestrator.attempts.disk_space import is_disk_full_error
from orchestrator.errors import (
    ClusterBusy,
    InvalidTransition,
    LauncherError,
    OrchError,
    OrchShortOf,
    is_orch_shortage,
)
from orchestrator.executors.base import Executor, LaunchHandle, LaunchSpec, in_threads
from orchestrator.executors.checkpoints import CheckpointSearch, search_checkpoints
from orchestrator.executors.provenance import WORKER_PROVENANCE_NOTES, WORKER_PROVENANCE_VAR
from orchestrator.executors.run_dir import build_argv, build_worker_env, prepare_run_dir
from orchestrator.gpu.host import HostProbe
from orchestrator.gpu.mps import MpsState
from orchestrator.gpu.sim_footprint import footprint_env
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.plans.model import ShareBase
from orchestrator.plans.resume import (
    checkpoint_marker,
    resumable_attempts,
    resume_config,
    takes_resume_key,
    worker_can_resume,
)
from orchestrator.prediction.fused_groups import fuse_max, fused, shares_base
from orchestrator.prediction.job_facts import job_inexact_rungs, job_keys
from orchestrator.prediction.ladder import Level
from orchestrator.procstat import process_start
from orchestrator.rundir_files import TOKEN_VAR, RunDir
from orchestrator.scheduling.packing.types import PackingPolicy
from orchestrator.scheduling.resources import free_port
from orchestrator.store.attempts import (
    AttemptPlan,
    past_attempts,
    start_attempt,
    update_attempt,
)
from orchestrator.store.db import Store
from orchestrator.store.peak_source import PredictionSource, SourceKind
from orchestrator.store.resources import live_ports
from orchestrator.store.rows import Attempt, Job

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DispatchContext:
    runs_dir: Path
    policy: PackingPolicy
    worker_env: dict[str, str]  # injected into every attempt on top of the per-attempt env
    host: HostProbe | None = None  # host RAM and cores; None: not looked at
    host_reserve_mib: int = 2048  # kept free of jobs (--host-reserve-gib)
    topology: Mapping[tuple[int, int], int] | None = None  # card distances, read once at start
    mps: MpsState | None = None  # orch's MPS control daemon and the cards under it; None: no MPS


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80]


def share_env(job: Job, gpus: int, run_alone: bool, local: bool, runs_dir: Path,
              fused_cap: int | None = None, fuse_process: int | None = None) -> dict[str, str]:
    """What points an attempt at a warm LoRA worker process: for a one-card job of a suite with
    `share_base` sequential or fused, on this host, unless the ladder runs it alone on its card.
    A fused attempt is also told the most members its group may have (ORCH_FUSE_MAX): its
    suite's `fused_members`, or `fused_cap` where a group of the suite ran out of memory; and
    its suite (ORCH_FUSE_SUITE), so that it joins only a process of its own suite's group; and
    the process placement counted it in (ORCH_FUSE_PROCESS, `fuse_process`), so that it joins that
    one (or an idle one, which takes the name) and the groups that train are those placed. Every
    LoRA attempt on this host gets the folder: a resume there waits on the lock of the job a
    warm process may still train in the checkpoint's run dir (workers/lora/resume_guard.py)."""
    if job.worker != "lora" or not local:
        return {}
    folder = {SHARE_DIR_VAR: str(runs_dir / WARM_DIR)}
    if not shares_base(job) or gpus != 1 or run_alone:
        return folder
    if fused(job):
        named = {FUSE_PROCESS_VAR: str(fuse_process)} if fuse_process is not None else {}
        return {SHARE_BASE_VAR: ShareBase.FUSED.value, FUSE_MAX_VAR: str(fuse_max(job, fused_cap)),
                FUSE_SUITE_VAR: job.suite, **named, **folder}
    return {SHARE_BASE_VAR: ShareBase.SEQUENTIAL.value, **folder}


def run_dir_for(ctx: DispatchContext, job: Job, n: int) -> Path:
    task = f"-{_safe_name(job.data)}" if job.data else ""  # a script without tasks has none
    job_dir = f"{job.id:06d}-{_safe_name(job.config_name)}-s{job.seed}{task}"
    return ctx.runs_dir / _safe_name(job.suite) / job_dir / f"attempt-{n}"


@dataclass(frozen=True)
class Claim:
    """An attempt written as started (the job moved to running), its worker not yet launched."""

    job: Job
    gpu: GpuSnapshot
    attempt: Attempt
    config: dict[str, Any]  # the job's config with the level's overrides, paths resolved
    cards: tuple[GpuSnapshot, ...] = ()  # a multi-GPU job's cards in order (gpu is the first)
    measured_shape: bool = False  # the prediction is a peak measured on this shape (MPS fence)
    fused_cap: int | None = None  # its suite's fused group cap after a group OOM; None: none lowered


# Predictions that are peaks of the shape itself: only these tighten an MPS fence.
MEASURED_SHAPE = frozenset({SourceKind.MEASURED, SourceKind.RUNNING})
# `share_base: sequential` (workers/lora/share.py reads these): the attempt's worker hands its
# job to a warm LoRA worker process, whose sockets and locks are in the runs dir's WARM_DIR.
SHARE_BASE_VAR, SHARE_DIR_VAR, WARM_DIR = "ORCH_SHARE_BASE", "ORCH_SHARE_DIR", ".warm"
FUSE_MAX_VAR = "ORCH_FUSE_MAX"  # `share_base: fused`: the most members of the group it joins
# and the suite, part of the worker's group key: its groups are the ones placement counts
FUSE_SUITE_VAR = "ORCH_FUSE_SUITE"
FUSE_PROCESS_VAR = "ORCH_FUSE_PROCESS"  # the process placement counted it in (workers/lora/share.py)
LAUNCH_THREADS = 8  # run dirs and windows of one pass made side by side (fsync, tmux wait)


def launch_all(
    store: Store, executor: Executor, ctx: DispatchContext, claims: list[Claim]
) -> None:
    """Start the workers of the attempts claimed this pass: first every run dir (up to
    LAUNCH_THREADS at once: they wait on fsync, not the CPU), then every worker, in few
    executor calls where the executor can batch (tmux) — before the first worker starts
    competing for the CPU. Every database write stays on this thread."""
    if not claims:
        return
    local = not executor.remote  # a cluster node has no use for our cgroups
    specs: list[LaunchSpec | Exception] = in_threads(lambda c: _prepare(ctx, c, local), claims, LAUNCH_THREADS)
    ready = [(i, spec) for i, spec in enumerate(specs) if isinstance(spec, LaunchSpec)]
    outcomes: list[LaunchHandle | Exception] = [s if isinstance(s, Exception) else LauncherError("") for s in specs]
    try:
        handles: list[LaunchHandle | Exception] = executor.submit_many([spec for _, spec in ready])
    except OrchShortOf as short:
        # orch could not even run its launcher (out of descriptors, say): no worker of the batch
        # started (a launch tmux may still carry out later is marked lost by the executor first).
        # Each attempt ends now, uncounted, and is requeued; raised on, they waited out the launch
        # grace (a minute) as launches that never completed.
        handles = [short] * len(ready)
    for (i, _), handle in zip(ready, handles, strict=True):
        outcomes[i] = handle
    # The executor's pid and the create time read now are what later proves which process
    # group is this attempt's; nothing the worker writes can change them.
    started = [
        (claimed.attempt.id, outcome, _create_time(outcome.pid))
        for claimed, outcome in zip(claims, outcomes, strict=True) if not isinstance(outcome, Exception)
    ]
    with store.write():  # one commit for the batch: 64 of them took seconds while 64 workers started
        for attempt_id, handle, create_time in started:
            update_attempt(store, attempt_id, executor=handle.executor, executor_id=handle.executor_id,
                           pid=handle.pid, proc_create_time=create_time)
    for claimed, outcome in zip(claims, outcomes, strict=True):
        if isinstance(outcome, Exception):
            from orchestrator.attempts.outcomes import fail_before_start

            full = is_disk_full_error(outcome)
            # submitted again once the cluster answers, or once orch has descriptors, processes,
            # memory or a working tmux again: not the job's doing, not counted
            busy = isinstance(outcome, ClusterBusy) or is_orch_shortage(outcome)
            fail_before_start(store, claimed.attempt, f"{'disk full: ' if full else ''}could not start: {outcome}",
                              disk_full=full, not_counted=busy)


def _create_time(pid: int | None) -> float | None:
    if pid is None:
        return None
    start = process_start(pid)
    return start[0] if start is not None else None


def claim(
    store: Store,
    ctx: DispatchContext,
    job: Job,
    level: Level,
    config: dict[str, Any],
    gpu: GpuSnapshot,
    predicted_mib: int,
    source: PredictionSource,
    reserved_mib: int,
    cards: tuple[GpuSnapshot, ...] = (),
    host_mib: int = 0,
    fused_cap: int | None = None,
    ahead: bool = False,
    fuse_process: int | None = None,
    opens_process: bool = False,
    trial_fence_mib: int | None = None,
) -> Claim | None:
    """Write the attempt as started (the job moves to running); None if the job left the queue.
    A multi-GPU job's attempt records all its `cards` and a rendezvous port ({port}). A fused
    member records the process it joins (`fuse_process`: the attempt that opened it), or that it
    opens one (`opens_process`). A start on trial records the room it got (`trial_fence_mib`), where
    MPS fences it."""
    uuids = tuple(c.uuid for c in cards) if len(cards) > 1 else ()
    search = resume_point(store, job)
    checkpoint = search.checkpoint
    if checkpoint is not None and takes_resume_key(job.worker, job_keys(job), job.config):
        config = resume_config(config, job_keys(job), str(checkpoint.path))  # {resume} alone: not in config.yaml
    plan = AttemptPlan(
        job_id=job.id, gpu_index=gpu.index, gpu_uuid=gpu.uuid, level=level.index,
        level_step=level.rung, changes=dict(level.changes), overrides=dict(level.overrides),
        run_alone=level.run_alone, predicted_peak_mib=predicted_mib, prediction_source=source,
        reserved_mib=reserved_mib, gpu_uuids=uuids, port=free_port(live_ports(store)), predicted_host_mib=host_mib,
        resumed_from_attempt=checkpoint.attempt_n if checkpoint else None,
        resumed_from_checkpoint=str(checkpoint.path) if checkpoint else None,
        searched_in_part=search.searched_in_part, inexact_rungs=job_inexact_rungs(job, level.index),
        started_ahead=ahead, fuse_process=fuse_process, opens_process=opens_process,
        trial_fence_mib=trial_fence_mib,
    )
    try:
        attempt = start_attempt(store, plan, lambda n: run_dir_for(ctx, job, n))
    except InvalidTransition:
        return None  # cancelled between the read and the claim
    return Claim(job, gpu, attempt, config, cards if len(cards) > 1 else (gpu,),
                 measured_shape=source.kind in MEASURED_SHAPE, fused_cap=fused_cap)


def resume_point(store: Store, job: Job) -> CheckpointSearch:
    """The checkpoint the job's next attempt resumes from: the latest its earlier attempts left
    in their run dirs (those a resume may cross: plans.resume), where its worker can take one;
    none otherwise (and for a first attempt)."""
    if job.attempt_count == 0 or not worker_can_resume(job.worker, job_keys(job), job.config):
        return CheckpointSearch(None)
    usable = resumable_attempts(past_attempts(store, job.id), job.worker, job.fresh_after_attempt)
    runs = ((n, Path(run_dir)) for n, run_dir in usable)
    return search_checkpoints(runs, checkpoint_marker(job.worker))


def _prepare(ctx: DispatchContext, claimed: Claim, local: bool = True) -> LaunchSpec | Exception:
    """Run dir and launch spec of one claimed attempt; no database access (it runs in a pool)."""
    job, gpu, attempt = claimed.job, claimed.gpu, claimed.attempt
    cards = claimed.cards or (gpu,)
    run_dir = Path(attempt.run_dir)
    shared = share_env(job, len(cards), attempt.run_alone, local, ctx.runs_dir, claimed.fused_cap,
                       attempt.fuse_process)
    # A warm LoRA worker process outlives the attempt that starts it and trains other jobs (a
    # fused one, several at once): a fence of this job's would bound them all, and, being part of
    # the process's environment, split the warm processes by fence. Such a process is not fenced.
    own_process = SHARE_BASE_VAR not in shared
    mps_env = ctx.mps.env_for(gpu.uuid, len(cards), attempt.run_alone, attempt.predicted_peak_mib,
                              measured=claimed.measured_shape and own_process,
                              trial_fence_mib=attempt.trial_fence_mib if own_process else None) if ctx.mps else {}
    try:
        env = build_worker_env(
            gpu_uuid=",".join(c.uuid for c in cards), gpu_index=gpu.index, seed=job.seed,
            suite_env=dict(job.env),
            extra={**ctx.worker_env, "ORCH_JOB_ID": str(job.id), "ORCH_ATTEMPT": str(attempt.n),
                   "ORCH_RUN_DIR": str(run_dir), **tracking_env(ctx.runs_dir, attempt.id, cgroup=local),
                   **({TOKEN_VAR: attempt.token} if attempt.token else {}), **mps_env,
                   **footprint_env(ctx.worker_env, job.worker, job.declared_mib),
                   **shared,
                   **({WORKER_PROVENANCE_VAR: note} if (note := WORKER_PROVENANCE_NOTES.get(job.worker)) else {})},
        )
        moved_to = prepare_run_dir(run_dir, claimed.config, env)
        if moved_to is not None:
            log.warning("%s already held files of an earlier database's job; moved them to %s", run_dir, moved_to)
        argv = build_argv(
            job.worker, config_path=RunDir(run_dir).config, run_dir=run_dir,
            values={"seed": str(job.seed), "data": job.data, "job": str(job.id),
                    "nproc": str(len(cards)), "port": str(attempt.port),
                    "resume": attempt.resumed_from_checkpoint or ""}, config=claimed.config,
        )
    except (OSError, ValueError, OrchError, LauncherError) as exc:
        return exc
    return LaunchSpec(
        job_id=job.id,
        attempt_id=attempt.id,
        window_name=f"job{job.id}-{_safe_name(job.config_name)[:30]}",
        argv=argv,
        env=env,
        run_dir=run_dir,  # the executor puts the wrapper in front
        meta={
            "suite": job.suite,
            "n": attempt.n,
            "predicted_peak_mib": attempt.predicted_peak_mib,
            "run_alone": attempt.run_alone,
            "slurm": dict(job.slurm),
            "gpus": job.gpus,
            "can_resume": worker_can_resume(job.worker, job_keys(job), claimed.config),
        },
    )
