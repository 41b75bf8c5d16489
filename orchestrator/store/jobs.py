"""Writes to the jobs, events and gpu_plan tables. Each state change goes through `transition`,
which checks the lifecycle table and writes the event in the same transaction."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import InvalidTransition, JobNotFound, UsageError
from orchestrator.lifecycle import JobState, check_transition
from orchestrator.plans import GpuPlan, JobSpec, Suite
from orchestrator.plans.ladder_spec import is_one_token_task
from orchestrator.store.db import Store

# a job in one of these states is there already: submitting it again adds nothing (a pruned one
# was stopped by early stopping: submitted again unchanged, it would run the steps saved)
PRESENT = (JobState.QUEUED.value, JobState.RUNNING.value, JobState.SUCCEEDED.value, JobState.PRUNED.value)


def add_event(
    store: Store,
    kind: str,
    message: str,
    *,
    job_id: int | None = None,
    attempt_id: int | None = None,
    from_state: str | None = None,
    to_state: str | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    store._db.execute(
        INSERT_EVENT,
        event_row(store.now_s(), kind, message, job_id, attempt_id, from_state, to_state, data),
    )


INSERT_EVENT = (
    "INSERT INTO events (ts, job_id, attempt_id, kind, from_state, to_state, message, data_json, retry) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def event_row(
    ts: float, kind: str, message: str, job_id: int | None, attempt_id: int | None,
    from_state: str | None, to_state: str | None, data: dict[str, Any] | None,
) -> tuple[Any, ...]:
    """An events row as INSERT_EVENT takes it."""
    # A move down the ladder (data["retry"]) is marked as one, for the reads that list them.
    retry = int(data is not None and isinstance(data.get("retry"), dict))
    return (ts, job_id, attempt_id, kind, from_state, to_state, message,
            json.dumps(data, default=str) if data else None, retry)


def transition(
    store: Store,
    job_id: int,
    to_state: JobState,
    *,
    message: str,
    kind: str = "state",
    expect_from: Sequence[JobState] | None = None,
    attempt_id: int | None = None,
    fields: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> JobState:
    """Move a job to `to_state` (checked against the table), with its event, atomically.

    Returns the state it left. The UPDATE is a compare-and-swap on the state just read, so a
    concurrent writer cannot slip a change in between.
    """
    with store.write():
        row = store._db.execute("SELECT state FROM jobs WHERE id = ?", [job_id]).fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id}")
        from_state = JobState(row[0])
        if expect_from is not None and from_state not in expect_from:
            raise InvalidTransition(
                f"job {job_id} is {from_state.value}, expected {' or '.join(s.value for s in expect_from)}"
            )
        check_transition(from_state, to_state)
        updates: dict[str, Any] = {"state": to_state.value, "updated_at": store.now_s()}
        if to_state is JobState.QUEUED:
            updates["queued_at"] = store.now_s()
            updates["wait_reason"] = None
        updates.update(fields or {})
        assignments = ", ".join(f"{column} = ?" for column in updates)
        cursor = store._db.execute(
            f"UPDATE jobs SET {assignments} WHERE id = ? AND state = ?",
            [*updates.values(), job_id, from_state.value],
        )
        if cursor.rowcount != 1:
            raise InvalidTransition(f"job {job_id} changed state while being updated; try again")
        add_event(
            store, kind, message, job_id=job_id, attempt_id=attempt_id,
            from_state=from_state.value, to_state=to_state.value, data=data,
        )
    return from_state


@dataclass(frozen=True)
class SubmitOutcome:
    spec: JobSpec
    job_id: int | None  # None in a dry run of a new job
    created: bool
    existing_state: str | None  # the state of the job already there, when not created
    # created, and ended pruned at once: early stopping had stopped its setting (submit.core)
    pruned_at_once: bool = False

    def state_said(self, dry_run: bool) -> str:
        """The job's state once the submit is done; in a dry run, a new job's would-be state."""
        if not self.created:
            return self.existing_state or "unknown"
        state = "pruned" if self.pruned_at_once else "queued"
        return f"would be {state}" if dry_run else state


def submit_jobs(
    store: Store,
    suite: Suite,
    specs: Sequence[JobSpec],
    *,
    allowed_gpus: Sequence[int] | None,
    priority: int,
    force: bool,
    dry_run: bool,
) -> list[SubmitOutcome]:
    """Queue the specs; a job already queued, running, succeeded or pruned is reported, not duplicated."""
    whole = isinstance(priority, int) and not isinstance(priority, bool)
    if not whole or not -(2**63) <= priority < 2**63:
        # the last line of defence: a priority that is not a whole number stalls every pass
        raise UsageError(f"priority {str(priority)[:40]!r} is not a whole number")
    outcomes: list[SubmitOutcome] = []
    declared_mib = round(suite.mem_gib * 1024)
    with store.write():
        for spec in specs:
            existing = store._db.execute(
                f"SELECT id, state FROM jobs WHERE identity = ? AND state IN ({','.join('?' * len(PRESENT))}) "
                "ORDER BY id DESC LIMIT 1",
                [spec.identity, *PRESENT],
            ).fetchone()
            if existing is not None and not force:
                outcomes.append(SubmitOutcome(spec, existing[0], False, existing[1]))
                continue
            if dry_run:
                outcomes.append(SubmitOutcome(spec, None, True, None))
                continue
            check_transition(None, JobState.QUEUED)
            ts = store.now_s()
            cursor = store._db.execute(
                "INSERT INTO jobs (identity, suite, config_name, config_path, config_json, seed, data, "
                "overrides_json, env_json, worker, declared_mib, allowed_gpus_json, priority, state, "
                "max_attempts, one_token, ladder_json, hang_timeout_s, crash_loop_failures, crash_loop_within_s, "
                "crash_loop_window_s, queued_at, created_at, updated_at, worker_output_json, "
                "memory_keys_json, min_stack_gain) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    spec.identity,
                    spec.suite,
                    spec.config_name,
                    spec.config_path,
                    json.dumps(spec.config, sort_keys=True),
                    spec.seed,
                    spec.data,
                    json.dumps(spec.overrides, sort_keys=True),
                    json.dumps(spec.env, sort_keys=True),
                    suite.worker,
                    declared_mib,
                    json.dumps(list(allowed_gpus)) if allowed_gpus is not None else None,
                    priority,
                    JobState.QUEUED.value,
                    suite.max_attempts,
                    int(is_one_token_task(spec.data, list(suite.one_token_tasks))),
                    json.dumps(suite.ladder) if suite.ladder is not None else None,
                    suite.hang_timeout_s,
                    suite.crash_loop.failures,
                    suite.crash_loop.within_s,
                    suite.crash_loop.window_s,
                    ts,
                    ts,
                    ts,
                    json.dumps(suite.worker_output, sort_keys=True),
                    json.dumps(list(suite.memory_keys)),
                    suite.min_stack_gain,
                ],
            )
            job_id = int(cursor.lastrowid or 0)
            if getattr(suite, "slurm", None):
                store._db.execute(
                    "UPDATE jobs SET slurm_json = ? WHERE id = ?",
                    [json.dumps(suite.slurm, sort_keys=True), job_id],
                )
            store._db.execute("UPDATE jobs SET gpus = ?, cpus = ?, max_resumes = ? WHERE id = ?",
                              [spec.gpus, spec.cpus, suite.max_resumes, job_id])
            if suite.search is not None and spec.trial is not None:
                store._db.execute("UPDATE jobs SET search_json = ? WHERE id = ?", [json.dumps(
                    {"spec": suite.search.to_json(), "trial": spec.trial, "max_attempts": suite.max_attempts},
                    sort_keys=True), job_id])
            if suite.early_stop is not None:
                store._db.execute("UPDATE jobs SET early_stop_json = ? WHERE id = ?",
                                  [json.dumps(suite.early_stop.to_json(), sort_keys=True), job_id])
            if suite.not_science:
                store._db.execute("UPDATE jobs SET not_science_json = ? WHERE id = ?",
                                  [json.dumps(sorted(suite.not_science)), job_id])
            add_event(
                store, "submitted",
                f"queued {spec.suite}/{spec.config_name} seed {spec.seed}"
                + (f" on {spec.data}" if spec.data else ""),
                job_id=job_id, to_state=JobState.QUEUED.value,
            )
            outcomes.append(SubmitOutcome(spec, job_id, True, None))
    return outcomes


def set_gpu_plan(store: Store, plan: GpuPlan) -> None:
    """Store `plan` in place of the old one, whole: a GPU the old plan named and this one does
    not goes back to the default cap."""
    with store.write():
        ts = store.now_s()
        store._db.execute("DELETE FROM gpu_plan")
        if plan.default_slots is not None:
            store._db.execute(
                "INSERT INTO gpu_plan (gpu_index, slots, updated_at) VALUES (-1, ?, ?)",
                [plan.default_slots, ts],
            )
        for gpu_index, slots in plan.slots_by_gpu.items():
            store._db.execute(
                "INSERT INTO gpu_plan (gpu_index, slots, updated_at) VALUES (?, ?, ?)",
                [gpu_index, slots, ts],
            )
        add_event(store, "plan", f"GPU plan set: {format_plan(plan)}")


def get_gpu_plan(store: Store) -> GpuPlan:
    rows = store.query("SELECT gpu_index, slots FROM gpu_plan ORDER BY gpu_index")
    default = next((r["slots"] for r in rows if r["gpu_index"] == -1), None)
    return GpuPlan(
        slots_by_gpu={r["gpu_index"]: r["slots"] for r in rows if r["gpu_index"] >= 0},
        default_slots=default,
    )


def format_plan(plan: GpuPlan) -> str:
    parts = [f"GPU {g}: {s}" for g, s in sorted(plan.slots_by_gpu.items())]
    if plan.default_slots is not None:
        parts.append(f"others: {plan.default_slots}")
    return ", ".join(parts) or "(default)"


def cancel_queued(store: Store, job_id: int, reason: str) -> JobState:
    return transition(
        store, job_id, JobState.CANCELLED, message=f"cancelled: {reason}", kind="cancel",
        expect_from=[JobState.QUEUED], fields={"reason": reason, "wait_reason": None},
    )


def move_queued_to_level(store: Store, job_ids: Sequence[int], level: int, note: str) -> list[int]:
    """Move queued jobs to ladder `level` (the level they were at fits no card they may use, or
    a later exact level ends sooner), with the note `orch show` gives and an event each. Returns
    the ids moved: a job that left the queue or is there already is left alone."""
    moved: list[int] = []
    with store.write():
        for job_id in job_ids:
            cursor = store._db.execute(
                "UPDATE jobs SET level = ?, level_note = ?, updated_at = ? WHERE id = ? AND state = 'queued' "
                "AND level < ?", [level, note, store.now_s(), job_id, level])
            if cursor.rowcount:
                add_event(store, "level", note, job_id=job_id, data={"to_level": level})
                moved.append(job_id)
    return moved
