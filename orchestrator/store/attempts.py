"""Writes to the attempts and memory_shapes tables, each with the job transition it implies."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import InvalidTransition
from orchestrator.lifecycle import JobState
from orchestrator.store.db import Store
from orchestrator.store.jobs import add_event, transition
from orchestrator.store.peak_source import PredictionSource
from orchestrator.store.rows import Attempt, ShapeMemory


@dataclass(frozen=True)
class AttemptPlan:
    """Everything decided about an attempt before it starts."""

    job_id: int
    gpu_index: int
    gpu_uuid: str
    level: int
    level_step: str
    changes: dict[str, Any]
    overrides: dict[str, Any]
    run_alone: bool
    predicted_peak_mib: int
    prediction_source: PredictionSource  # stored as its rendered text
    reserved_mib: int
    gpu_uuids: tuple[str, ...] = ()  # a multi-GPU job's cards in order (the first is gpu_uuid)
    port: int | None = None  # the rendezvous port chosen for this attempt ({port})
    predicted_host_mib: int = 0  # host RAM reserved for the attempt's process tree
    resumed_from_attempt: int | None = None  # the earlier attempt (n) whose checkpoint it resumes from
    resumed_from_checkpoint: str | None = None  # that checkpoint's folder
    searched_in_part: tuple[int, ...] = ()  # earlier attempts whose run dir the checkpoint search read in part
    inexact_rungs: tuple[str, ...] = ()  # the rungs changing numerics its level went through
    started_ahead: bool = False  # before the memory or slot it needs was free (--overlap)
    # `share_base: fused`: the process it joins (the id of the attempt that opened it), or
    # `opens_process`: it opens one, named by its own id; neither: not a fused member
    fuse_process: int | None = None
    opens_process: bool = False
    # a start on trial (--mps): the room it gets, less than its prediction, where MPS fences it
    trial_fence_mib: int | None = None


def start_attempt(store: Store, plan: AttemptPlan, run_dir_for: Any) -> Attempt:
    """Create the attempt and move its job queued -> running in one transaction, so the
    reservation exists the moment the job counts as running. `run_dir_for(n)` names the dir."""
    with store.write():
        job = store.query("SELECT state, attempt_count FROM jobs WHERE id = ?", [plan.job_id])
        if not job or job[0]["state"] != JobState.QUEUED.value:
            raise InvalidTransition(f"job {plan.job_id} is no longer queued")
        n = job[0]["attempt_count"] + 1
        run_dir = str(run_dir_for(n))
        cursor = store._db.execute(
            "INSERT INTO attempts (job_id, n, gpu_index, gpu_uuid, level, level_step, changes_json, "
            "overrides_json, run_alone, run_dir, predicted_peak_mib, prediction_source, reserved_mib, "
            "started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                plan.job_id, n, plan.gpu_index, plan.gpu_uuid, plan.level, plan.level_step,
                json.dumps(plan.changes, sort_keys=True), json.dumps(plan.overrides, sort_keys=True),
                int(plan.run_alone), run_dir, plan.predicted_peak_mib, plan.prediction_source.render(),
                plan.reserved_mib, store.now_s(),
            ],
        )
        attempt_id = int(cursor.lastrowid or 0)
        store._db.execute(
            "UPDATE attempts SET gpu_uuids_json = ?, port = ?, predicted_host_mib = ?, resumed_from_attempt = ?, "
            "resumed_from_checkpoint = ?, worker = (SELECT worker FROM jobs WHERE id = ?), token = ?, "
            "inexact_rungs_json = ?, fuse_process = ?, trial_fence_mib = ? WHERE id = ?",
            [json.dumps(list(plan.gpu_uuids)) if plan.gpu_uuids else None, plan.port, plan.predicted_host_mib,
             plan.resumed_from_attempt, plan.resumed_from_checkpoint, plan.job_id, secrets.token_hex(16),
             json.dumps(list(plan.inexact_rungs)), attempt_id if plan.opens_process else plan.fuse_process,
             plan.trial_fence_mib, attempt_id],
        )
        # a host step taken at level 0 is worth naming too (level_step says which)
        level_note = f" at level {plan.level} ({plan.level_step})" if plan.level or plan.overrides else ""
        transition(
            store, plan.job_id, JobState.RUNNING,
            message=(
                f"attempt {n} started on GPU {plan.gpu_index}{_more_gpus(plan)}{level_note}, predicted "
                f"{plan.predicted_peak_mib / 1024:.1f} GiB{' per GPU' if len(plan.gpu_uuids) > 1 else ''} "
                f"({plan.prediction_source.render()})" + _resume_note(plan)
                + ("; started ahead (--overlap): its start-up runs while the attempts it waits for end"
                   if plan.started_ahead else "") + _trial_note(plan)
            ),
            kind="start", expect_from=[JobState.QUEUED], attempt_id=attempt_id,
            fields={"attempt_count": n, "wait_reason": None},
        )
    return Attempt.from_row(store.query("SELECT * FROM attempts WHERE id = ?", [attempt_id])[0])


def _trial_note(plan: AttemptPlan) -> str:
    if plan.trial_fence_mib is None:
        return ""
    return (f"; started on trial in {plan.trial_fence_mib / 1024:.1f} GiB, its MPS fence (its prediction did "
            "not fit; an out-of-memory error under that fence requeues it at this level, not counted)")


def _resume_note(plan: AttemptPlan) -> str:
    note = ""
    if plan.resumed_from_checkpoint is not None:
        name = plan.resumed_from_checkpoint.rstrip("/").rsplit("/", 1)[-1]
        note = f", resuming from attempt {plan.resumed_from_attempt}'s {name}"
    if plan.searched_in_part:
        shown = ", ".join(str(n) for n in plan.searched_in_part)
        note += f"; the checkpoint search read the run dir of attempt(s) {shown} only in part (too many entries)"
    return note


@dataclass(frozen=True)
class PastAttempt:
    """What deciding a resume needs of an earlier attempt."""

    n: int
    run_dir: str
    outcome: str | None  # None while it has not ended
    reason: str | None
    worker: str | None  # the command it ran; None for attempts recorded before it was kept


def past_attempts(store: Store, job_id: int) -> list[PastAttempt]:
    """Every attempt of the job so far, the latest first."""
    rows = store.query(
        "SELECT n, run_dir, outcome, reason, worker FROM attempts WHERE job_id = ? ORDER BY n DESC", [job_id]
    )
    return [PastAttempt(int(r["n"]), str(r["run_dir"]), r["outcome"], r["reason"], r["worker"]) for r in rows]


def _more_gpus(plan: AttemptPlan) -> str:
    return f" and {len(plan.gpu_uuids) - 1} more" if len(plan.gpu_uuids) > 1 else ""


def update_attempt(store: Store, attempt_id: int, **fields: Any) -> None:
    if not fields:
        return
    assignments = ", ".join(f"{column} = ?" for column in fields)
    with store.write():
        store._db.execute(f"UPDATE attempts SET {assignments} WHERE id = ?", [*fields.values(), attempt_id])


def read_attempt(store: Store, attempt_id: int) -> Attempt | None:
    rows = store.query("SELECT * FROM attempts WHERE id = ?", [attempt_id])
    return Attempt.from_row(rows[0]) if rows else None


def last_attempt_id(store: Store) -> int:
    """The highest attempt id so far (0: none). Attempts are never deleted, so ids only grow."""
    rows = store.query("SELECT COALESCE(MAX(id), 0) AS id FROM attempts")
    return int(rows[0]["id"])


def attempt_closed(store: Store, attempt_id: int) -> bool:
    """The attempt's end is recorded."""
    return bool(store.query("SELECT 1 FROM attempts WHERE id = ? AND outcome IS NOT NULL", [attempt_id]))


@dataclass(frozen=True)
class AttemptEnd:
    outcome: str
    reason: str
    exit_code: int | None
    signal: int | None
    peak_mib: int
    job_state: JobState  # where the job goes next
    job_fields: dict[str, Any]
    message: str
    data: dict[str, Any] | None = None
    output_metrics: dict[str, float] | None = None  # parsed from stdout when there is no result.json
    loss: dict[str, Any] | None = None  # the loss summary the divergence rule judged
    diverged: str | None = None  # why the rule flagged the run; None: not flagged
    provenance: dict[str, Any] | None = None  # the validated digest of provenance.json
    reported: dict[str, Any] | None = None  # what it reported for results (attempts.reported)


def finish_attempt(store: Store, attempt: Attempt, end: AttemptEnd) -> bool:
    """Record the attempt's end and move its job, atomically. A job that is no longer running
    (cancelled meanwhile by hand) keeps its state; the attempt is still closed. False when
    another writer had closed it already (nothing is written then)."""
    with store.write():
        cursor = store._db.execute(
            "UPDATE attempts SET outcome = ?, reason = ?, exit_code = ?, signal = ?, peak_mib = ?, "
            "ended_at = ? WHERE id = ? AND outcome IS NULL",
            [end.outcome, end.reason, end.exit_code, end.signal, end.peak_mib, store.now_s(), attempt.id],
        )
        if cursor.rowcount != 1:
            return False  # closed already by another writer
        if end.output_metrics:
            store._db.execute(
                "UPDATE attempts SET output_metrics_json = ? WHERE id = ?",
                [json.dumps(end.output_metrics), attempt.id],  # printed order: the first is the headline
            )
        if end.loss is not None or end.diverged is not None or end.provenance is not None:
            store._db.execute(
                "UPDATE attempts SET loss_json = ?, diverged = ?, provenance_json = ? WHERE id = ?",
                [None if end.loss is None else json.dumps(end.loss), end.diverged,
                 None if end.provenance is None else json.dumps(end.provenance, sort_keys=True), attempt.id],
            )
        if end.reported is not None:  # read once, here: the results tables never reopen its run dir
            store._db.execute("UPDATE attempts SET reported_json = ? WHERE id = ?",
                              [json.dumps(end.reported, sort_keys=True), attempt.id])
        job = store.query("SELECT state FROM jobs WHERE id = ?", [attempt.job_id])[0]
        if job["state"] == JobState.RUNNING.value:
            transition(
                store, attempt.job_id, end.job_state, message=end.message, kind=f"end:{end.outcome}",
                expect_from=[JobState.RUNNING], attempt_id=attempt.id, fields=end.job_fields,
                data=end.data,
            )
        else:
            add_event(store, f"end:{end.outcome}", end.message, job_id=attempt.job_id,
                      attempt_id=attempt.id, data=end.data)
    return True


def backfill_reported(store: Store, readings: list[tuple[int, int, dict[str, Any]]]) -> None:
    """Store what attempts that ended before readings were stored at their end reported (job id,
    attempt n, the reading), read from their run dirs once; an attempt that has one keeps it."""
    with store.write():
        for job_id, n, record in readings:
            store._db.execute(
                "UPDATE attempts SET reported_json = ? WHERE job_id = ? AND n = ? AND reported_json IS NULL "
                "AND outcome IS NOT NULL", [json.dumps(record, sort_keys=True), job_id, n])


def _shape(row: dict[str, Any]) -> ShapeMemory:
    return ShapeMemory(peak_mib=row["peak_mib"], oom_floor_mib=row["oom_floor_mib"], samples=row["samples"],
                       disproved_mib=row.get("disproved_mib"))


def read_shape(store: Store, shape_key: str) -> ShapeMemory | None:
    rows = store.query("SELECT * FROM memory_shapes WHERE shape_key = ?", [shape_key])
    return _shape(rows[0]) if rows else None


def read_all_shapes(store: Store) -> dict[str, ShapeMemory]:
    """Every learned shape, in one query (the scheduler reads them once per pass)."""
    return {row["shape_key"]: _shape(row) for row in store.query("SELECT * FROM memory_shapes")}


def write_shape(store: Store, shape_key: str, shape: ShapeMemory) -> None:
    with store.write():
        store._db.execute(
            "INSERT INTO memory_shapes (shape_key, peak_mib, oom_floor_mib, samples, disproved_mib, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(shape_key) DO UPDATE SET peak_mib = excluded.peak_mib, "
            "oom_floor_mib = excluded.oom_floor_mib, samples = excluded.samples, "
            "disproved_mib = excluded.disproved_mib, updated_at = excluded.updated_at",
            [shape_key, shape.peak_mib, shape.oom_floor_mib, shape.samples, shape.disproved_mib, store.now_s()],
        )


def read_all_prompt_lengths(store: Store) -> dict[str, int]:
    """Every learned longest prompt, in one query (the scheduler reads them once per pass)."""
    rows = store.query("SELECT length_key, longest_tokens FROM prompt_lengths")
    return {row["length_key"]: int(row["longest_tokens"]) for row in rows}


def record_prompt_length(store: Store, length_key: str, longest_tokens: int) -> None:
    """The largest report wins, so an estimate built on it can only err high."""
    with store.write():
        store._db.execute(
            "INSERT INTO prompt_lengths (length_key, longest_tokens, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT(length_key) DO UPDATE SET longest_tokens = max(longest_tokens, "
            "excluded.longest_tokens), updated_at = excluded.updated_at",
            [length_key, longest_tokens, store.now_s()],
        )
