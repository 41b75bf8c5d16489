"""Scheduling for an executor whose cluster places the attempts (Slurm): no local packing.

Queued jobs are submitted in priority order, each with its predicted peak (which sizes the
shard request), until `max_in_queue` attempts are submitted; the cluster's scheduler decides
where and when each runs, and its pending reason is shown by `orch status`.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.errors import OrchError
from orchestrator.executors.base import Executor
from orchestrator.executors.slurm.parse import STUCK_WORDS
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.prediction.job_facts import (
    JobShapeCache,
    as_received,
    attempt_config,
    level_of,
)
from orchestrator.prediction.job_prediction import predict
from orchestrator.prediction.learned import Knowledge
from orchestrator.scheduling.dispatch import fail_queued, write_wait_reasons
from orchestrator.scheduling.launching import Claim, DispatchContext, claim, launch_all
from orchestrator.scheduling.waits import held_reason
from orchestrator.store.attempts import read_all_prompt_lengths, read_all_shapes
from orchestrator.store.cluster_ends import stuck_attempt_count
from orchestrator.store.db import Store
from orchestrator.store.queue import live_attempt_count, queued_whole_jobs
from orchestrator.store.status import paused_configs, paused_suites

# The attempt row's GPU while the cluster, not orch, picks the card.
CLUSTER_GPU = GpuSnapshot(index=-1, uuid="cluster", name="cluster", total_mib=0, used_mib=0, free_mib=0)


def cluster_cards(gpus: int) -> tuple[GpuSnapshot, ...]:
    """A `gpus: N` job's N cards, all the cluster's to pick: {nproc} is N, and the batch
    script asks for N GPUs of one node."""
    return (
        CLUSTER_GPU,
        *tuple(
            replace(CLUSTER_GPU, index=-1 - i, uuid=f"cluster-{i}") for i in range(1, max(1, gpus))
        ),
    )


def schedule_remote(
    store: Store, executor: Executor, ctx: DispatchContext, cache: JobShapeCache, *, draining: bool, max_in_queue: int,
    hold: str | None = None,
) -> int:
    """Submit what the queue limit allows; returns how many were submitted. `hold`: why nothing
    may start now (a full disk, an unsafe runs dir), shown on every queued job."""
    hold = hold or executor.submit_hold()  # sbatch waits out Slurm's backoff too
    paused = {p.suite for p in paused_suites(store, count_queued=False)}
    paused_cfgs = {(p.suite, p.config) for p in paused_configs(store, count_queued=False)}
    queued = queued_whole_jobs(store)
    in_queue = live_attempt_count(store) - stuck_attempt_count(store, STUCK_WORDS)  # those never start: no slot
    shapes = read_all_shapes(store)
    prompt_lengths = read_all_prompt_lengths(store)
    knowledge = Knowledge(shapes, {})
    reasons: dict[int, str] = {}
    placed: set[int] = set()
    claims: list[Claim] = []
    for job in queued:
        held_back = held_reason(job.suite, paused, draining, hold, config=job.config_name, paused_configs=paused_cfgs)
        if held_back is not None:
            reasons[job.id] = held_back
            continue
        if in_queue >= max_in_queue:
            reasons[job.id] = f"{in_queue} attempts already submitted to Slurm (--max-in-queue {max_in_queue})"
            continue
        try:
            level = level_of(job, cache)
        except OrchError as exc:
            fail_queued(store, job, f"invalid ladder: {exc}")
            continue
        predicted_mib, source = predict(shapes, job, level, cache, prompt_lengths, knowledge)
        claimed = claim(
            store,
            ctx,
            job,
            as_received(job, level),
            attempt_config(job, level),
            CLUSTER_GPU,
            predicted_mib,
            source,
            0,
            cards=cluster_cards(job.gpus),
        )
        if claimed is not None:
            claims.append(claimed)
        placed.add(job.id)
        in_queue += 1
    launch_all(store, executor, ctx, claims)
    write_wait_reasons(store, queued, reasons, placed)
    return len(placed)
