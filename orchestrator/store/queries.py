"""Read-only queries for the CLI and the web page, returning typed rows. Nothing here writes."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from orchestrator.errors import JobNotFound
from orchestrator.lifecycle import TERMINAL_VALUES, AttemptOutcome, JobState
from orchestrator.rundir_files import RunDir
from orchestrator.store.db import Store
from orchestrator.store.json_columns import json_column
from orchestrator.store.queue import job_by_id
from orchestrator.store.rows import Attempt, Job
from orchestrator.store.status import Event, job_events, recent_events

# lifecycle.TERMINAL_STATES as an SQL list (our own enum's values: nothing to escape)
TERMINAL_SQL = "(" + ", ".join(f"'{value}'" for value in TERMINAL_VALUES) + ")"
# The attempt `a` of job `j` whose card the job shows (`orch jobs` and the web's job list): its
# live attempt, or the last attempt of a job that has ended.
SHOWN_ATTEMPT_SQL = f"(a.outcome IS NULL OR (j.state IN {TERMINAL_SQL} AND a.n = j.attempt_count))"

# The columns are JobListRow's fields, in their order (rows are built by position).
_JOB_LIST_SQL = f"""
SELECT j.id, j.state, j.suite, j.config_name, j.seed, j.data, j.priority, j.level,
       j.attempt_count, j.wait_reason, j.reason, a.gpu_index AS gpu, j.overrides_json
FROM jobs j
LEFT JOIN attempts a ON a.job_id = j.id AND {SHOWN_ATTEMPT_SQL}
"""


_STATES = {s.value: s for s in JobState}


@functools.lru_cache(maxsize=4096)
def _parsed_overrides(text: str) -> tuple[tuple[str, Any], ...]:
    return tuple(json_column(text, {}, dict).items())


def job_overrides(text: str | None) -> dict[str, Any]:
    """A job's stored overrides as a fresh dict; the jobs of a grid share a few texts, each
    parsed once however many jobs are listed."""
    return dict(_parsed_overrides(text or "{}"))


class JobListRow(NamedTuple):
    """A job as `orch jobs` lists it, with the GPU of its live attempt, or of the last attempt of
    a job that has ended (None for a queued job, and one that never ran).
    A typed tuple, not a dataclass: a listing builds one per job, 100,000 of them at a time,
    and a tuple is built four times faster than a frozen dataclass."""

    id: int
    state: JobState
    suite: str
    config_name: str
    seed: int
    data: str
    priority: int
    level: int
    attempt_count: int
    wait_reason: str | None
    reason: str | None
    gpu: int | None
    overrides_json: str = "{}"  # its `--set` and `--grid` values, as stored (parsed by `overrides`)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> JobListRow:
        return cls(row["id"], _STATES[row["state"]], row["suite"], row["config_name"], row["seed"],
                   row["data"], row["priority"], row["level"], row["attempt_count"], row["wait_reason"],
                   row["reason"], row["gpu"], row.get("overrides_json") or "{}")

    @property
    def overrides(self) -> dict[str, Any]:
        """Its setting: the `--set` and `--grid` values it runs with ({} for none)."""
        return job_overrides(self.overrides_json)

    @classmethod
    def from_tuple(cls, row: tuple[Any, ...]) -> JobListRow:
        """From a row of `_JOB_LIST_SQL`, whose columns are these fields in this order."""
        return cls(row[0], _STATES[row[1]], *row[2:])


def job_row_to_public(row: JobListRow) -> dict[str, Any]:
    """The documented `--json` shape of one job in lists."""
    return {
        "id": row.id,
        "state": row.state.value,
        "suite": row.suite,
        "config": row.config_name,
        "seed": row.seed,
        "data": row.data,
        "gpu": row.gpu,
        "overrides": row.overrides,
        "attempt": row.attempt_count,
        "level": row.level,
        "priority": row.priority,
        "wait_reason": row.wait_reason,
        "reason": row.reason,
    }


def _job_list_sql(
    state: str | None, suite: str | None, limit: int | None, offset: int
) -> tuple[str, list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if state is not None:
        where.append("j.state = ?")
        params.append(state)
    if suite is not None:
        where.append("j.suite = ?")
        params.append(suite)
    sql = _JOB_LIST_SQL + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY j.id"
    if limit is not None or offset:
        sql += " LIMIT ? OFFSET ?"
        params += [-1 if limit is None else int(limit), int(offset)]
    return sql, params


def list_jobs(
    store: Store, *, state: str | None = None, suite: str | None = None, limit: int | None = None,
    offset: int = 0,
) -> list[JobListRow]:
    return list(iter_jobs(store, state=state, suite=suite, limit=limit, offset=offset))


def iter_jobs(
    store: Store, *, state: str | None = None, suite: str | None = None, limit: int | None = None,
    offset: int = 0,
) -> Iterator[JobListRow]:
    """`list_jobs`, streamed from a cursor (for output of any length in flat memory)."""
    return (JobListRow.from_tuple(r) for r in store.iter_rows(*_job_list_sql(state, suite, limit, offset)))


def iter_status_jobs(store: Store, *, limit: int | None = None, offset: int = 0) -> Iterator[dict[str, Any]]:
    """Every job in the `orch status --json` shape, by id, streamed."""
    # the listing's own rows, unpacked straight into the JSON shape (no row object per job)
    rows = store.iter_rows(*_job_list_sql(None, None, limit, offset))
    for job_id, state, suite, config, seed, data, _, level, attempt, _, _, gpu, overrides in rows:
        yield {"id": job_id, "state": state, "suite": suite, "config": config, "seed": seed, "data": data,
               "overrides": job_overrides(overrides), "gpu": gpu, "attempt": attempt, "level": level}


def state_counts(store: Store) -> dict[str, int]:
    counts = {s.value: 0 for s in JobState}
    for row in store.query("SELECT state, count(*) AS n FROM jobs GROUP BY state"):
        counts[row["state"]] = row["n"]
    return counts


def first_oom_job(store: Store) -> int | None:
    """The job whose attempt ran out of memory first (GPU or host), or None."""
    rows = store.query(
        "SELECT job_id FROM attempts WHERE outcome IN ('oom', 'host_oom') ORDER BY ended_at, id LIMIT 1"
    )
    return int(rows[0]["job_id"]) if rows else None


def get_job(store: Store, job_id: int) -> Job:
    """Raises JobNotFound for an unknown id."""
    job = job_by_id(store, job_id)
    if job is None:
        raise JobNotFound(f"no job {job_id} (see `orch jobs`)")
    return job


def get_attempts(store: Store, job_id: int) -> list[Attempt]:
    return [Attempt.from_row(r) for r in store.query("SELECT * FROM attempts WHERE job_id = ? ORDER BY n", [job_id])]


def latest_attempt(store: Store, job_id: int) -> Attempt | None:
    rows = store.query("SELECT * FROM attempts WHERE job_id = ? ORDER BY n DESC LIMIT 1", [job_id])
    return Attempt.from_row(rows[0]) if rows else None


def live_attempt(store: Store, job_id: int) -> Attempt | None:
    """The job's attempt whose end is not recorded yet, if it has one."""
    rows = store.query("SELECT * FROM attempts WHERE job_id = ? AND outcome IS NULL ORDER BY n DESC LIMIT 1", [job_id])
    return Attempt.from_row(rows[0]) if rows else None


def get_events(store: Store, job_id: int | None = None, limit: int = 200) -> list[Event]:
    """A job's first `limit` events, or (no job) the latest `limit` of all; oldest first."""
    return recent_events(store, limit) if job_id is None else job_events(store, job_id, limit)


@dataclass(frozen=True)
class JobHistory:
    """A job with every attempt and its events (`orch show`, the web page's job view)."""

    job: Job
    attempts: list[Attempt]
    events: list[Event]


def job_history(store: Store, job_id: int, *, events_limit: int = 200) -> JobHistory:
    """Raises JobNotFound for an unknown id."""
    return JobHistory(get_job(store, job_id), get_attempts(store, job_id), get_events(store, job_id, events_limit))


def job_ids_in_states(store: Store, states: Sequence[JobState], suite: str | None = None) -> list[int]:
    """Ids of the jobs in one of `states` (of one suite, when given), by id."""
    marks = ",".join("?" * len(states))
    values = [s.value for s in states]
    if suite is not None:
        rows = store.query(f"SELECT id FROM jobs WHERE suite = ? AND state IN ({marks}) ORDER BY id", [suite, *values])
    else:
        rows = store.query(f"SELECT id FROM jobs WHERE state IN ({marks}) ORDER BY id", values)
    return [int(r["id"]) for r in rows]


def _resources_public(a: Attempt) -> dict[str, Any]:
    """A multi-GPU attempt's cards, port and per-card / per-rank peaks; host RAM and CPU peaks."""
    return {
        "gpu_uuids": list(a.gpu_uuids) or [a.gpu_uuid],
        "port": a.port,
        "peak_by_gpu_mib": a.peak_by_gpu or None,
        "peak_by_rank_mib": a.peak_by_rank or None,
        "host_peak_mib": a.host_peak_mib,
        "cpu_peak_cores": a.cpu_peak_cores,
    }


def attempt_to_public(a: Attempt) -> dict[str, Any]:
    """The documented `--json` shape of one attempt."""
    return {
        "id": a.id,  # orch's own number for it (a fused process is named by its opener's)
        "n": a.n,
        "gpu": a.gpu_index,
        "gpu_uuid": a.gpu_uuid,
        "level": a.level,
        "step": a.level_step,
        "outcome": None if a.outcome is None else a.outcome.value,
        "exit_code": a.exit_code,
        "signal": a.signal,
        "reason": a.reason,
        "hunted": a.hunted,  # processes left running outside its group, ended at its end
        "peak_mib": a.peak_mib,
        **_resources_public(a),
        "predicted_peak_mib": a.predicted_peak_mib,
        "prediction_source": a.prediction_source,
        "started_at": a.started_at,
        "ended_at": a.ended_at,
        "run_dir": a.run_dir,
        "log": str(RunDir(a.run_dir).log),
        "overrides": a.overrides,
        "changes": a.changes,
        "run_alone": a.run_alone,
        "executor": a.executor,
        "executor_id": a.executor_id,  # a Slurm job id, a tmux window id
        # the warm LoRA worker process that trained it, as its share.json said; null: its own
        "share": None if a.share_process is None else {
            "mode": a.share_mode, "process": a.share_process, "pid": a.share_pid, "base_mib": a.share_base_mib,
        },
        # `share_base: fused`: the process the daemon placed it in (the attempt that opened it)
        "fuse_process": a.fuse_process,
        # a start on trial (--mps): the room it was started into and fenced at; null: an ordinary start
        "trial_fence_mib": a.trial_fence_mib,
        "resumed_from": None if a.resumed_from_checkpoint is None else {
            "attempt": a.resumed_from_attempt, "checkpoint": a.resumed_from_checkpoint,
        },
        "loss": a.loss or None,  # {initial, minimum, final, steps, final_steps, nonfinite} at its end
        "diverged": a.diverged,  # why the divergence rule flagged it; null: not flagged
        "provenance": a.provenance or None,  # its provenance.json, validated (code, libraries, GPU, host, data)
    }


def job_to_public(history: JobHistory) -> dict[str, Any]:
    job, attempts, events = history.job, history.attempts, history.events
    live = next((a for a in attempts if a.outcome is None), None)
    return {
        "id": job.id,
        "state": job.state.value,
        "suite": job.suite,
        "config": job.config_name,
        "config_path": job.config_path,
        "seed": job.seed,
        "data": job.data,
        "worker": job.worker,
        "priority": job.priority,
        "level": job.level,
        "level_note": job.level_note,
        "attempt": job.attempt_count,
        "max_attempts": job.max_attempts,
        "counted_attempts": job.counted_attempts,  # those that use up max_attempts (resumes do not)
        "resumes": job.resumes,
        "max_resumes": job.max_resumes,
        "gpu": live.gpu_index if live else None,
        "declared_mib": job.declared_mib,
        "allowed_gpus": None if job.allowed_gpus is None else sorted(job.allowed_gpus),
        "overrides": job.overrides,
        "trial": job.search.get("trial"),  # its trial's number in the suite's search:; null: none
        "early_stop": job.early_stop or None,  # the rule it was submitted with; null: none
        "config_content": job.config,
        "wait_reason": job.wait_reason,
        "reason": job.reason,
        "identity": job.identity,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "attempts": [attempt_to_public(a) for a in attempts],
        "events": [
            {"ts": e.ts, "kind": e.kind, "from": e.from_state, "to": e.to_state, "message": e.message, "data": e.data}
            for e in events
        ],
    }


def last_seen_gpu_indices(store: Store) -> list[int] | None:
    """The GPU indices of the daemon's last reading (None when no daemon has read any)."""
    rows = store.query("SELECT gpus_json FROM daemon WHERE id = 1")
    if not rows or not rows[0]["gpus_json"]:
        return None
    try:
        gpus = json.loads(rows[0]["gpus_json"])
        return sorted(int(g["index"]) for g in gpus)
    except (ValueError, TypeError, KeyError):
        return None


def not_science_texts(store: Store, suite: str) -> list[str]:
    """Each distinct `not_science` list (JSON) the suite's jobs were submitted with."""
    return [r["t"] or "[]" for r in store.query("SELECT DISTINCT not_science_json AS t FROM jobs WHERE suite = ?",
                                                  [suite])]


def suite_names(store: Store) -> list[str]:
    """Every suite that has jobs in this state.db."""
    return [r["suite"] for r in store.query("SELECT DISTINCT suite FROM jobs ORDER BY suite")]


@dataclass(frozen=True)
class ResultJob:
    """A job of a results table, whatever its state. A succeeded job comes with its succeeding
    attempt (where its result is and how it ran); any other job with its latest attempt, if it
    has one (where its error is), and `reason` (why it failed or was cancelled)."""

    job_id: int
    suite: str
    config: str
    data: str
    seed: int
    n: int | None  # the attempt: the succeeding one, else the latest; None before the first
    level: int | None
    level_step: str | None
    overrides: dict[str, Any]
    run_alone: bool
    run_dir: str | None
    output_metrics_json: str | None  # metrics the script printed, when it wrote no result.json
    # The job's effective config, as stored (JSON texts, parsed by the reader: many jobs share one)
    job_overrides_json: str = "{}"  # the job's `--set` overrides
    setting_json: str = "{}"  # the job's merged config without seed and data
    config_path: str = ""
    env_json: str = "{}"  # suite env + env.* overrides
    worker: str = ""  # the command the attempt ran (the job's, for attempts that did not record it)
    state: JobState = JobState.SUCCEEDED
    reason: str | None = None  # the job's reason: why it failed or was cancelled
    inexact_rungs: tuple[str, ...] | None = None  # rungs changing numerics the attempt went through; None: not recorded
    not_science_json: str = "[]"  # config keys that never split results rows (the suite's `not_science:`)
    diverged: str | None = None  # why the divergence rule flagged the run
    provenance_json: str | None = None  # the validated digest of its provenance.json
    level_note: str | None = None  # why the job started above the level its ladder gave it
    reported_json: str | None = None  # what the attempt reported, read at its end; None: ended before that
    ended_at: float | None = None  # when the attempt ended; None: not ended (or never started)
    attempt_reason: str | None = None  # the attempt's end, as recorded (with any run-dir files it ignored)

    @property
    def succeeded(self) -> bool:
        return self.state is JobState.SUCCEEDED


# A succeeded job's attempt is its succeeding one; any other job's its latest (its error).
_RESULT_JOBS_SQL = (
    "SELECT j.id AS job_id, j.suite, j.config_name, j.data, j.seed, j.state, j.reason, a.n, a.level, a.level_step, "
    "a.overrides_json, a.run_alone, a.run_dir, a.output_metrics_json, j.overrides_json AS job_overrides_json, "
    "a.inexact_rungs_json, a.diverged, a.provenance_json, a.reported_json, a.ended_at, a.reason AS attempt_reason, "
    "j.config_path, j.env_json, COALESCE(a.worker, j.worker) AS worker, j.not_science_json, j.level_note, "
    "CASE WHEN json_valid(j.config_json) THEN json_remove(j.config_json, '$.seed', '$.data') ELSE j.config_json END "
    "AS setting_json FROM jobs j LEFT JOIN attempts a ON a.job_id = j.id AND a.n = CASE WHEN j.state = ? "
    "THEN (SELECT MAX(s.n) FROM attempts s WHERE s.job_id = j.id AND s.outcome = ?) "
    "ELSE (SELECT MAX(l.n) FROM attempts l WHERE l.job_id = j.id) END"
)


def _names(text: str | None) -> tuple[str, ...] | None:
    """A stored JSON list of names; None when not recorded (or not such a list)."""
    value = json_column(text, None, list)
    return tuple(str(v) for v in value) if isinstance(value, list) else None


def result_jobs(store: Store, suite: str | None = None, job_ids: Sequence[int] | None = None) -> list[ResultJob]:
    """Every job of the results tables (of one suite, or all; or only these jobs), by job id:
    the one reader of results (`orch results`, the web page's results, `orch report`, the curves'
    bands). A succeeded job without a succeeded attempt (never written by orch) comes without one."""
    sql = _RESULT_JOBS_SQL
    params: list[Any] = [JobState.SUCCEEDED.value, AttemptOutcome.SUCCEEDED.value]
    where: list[str] = []
    if suite is not None:
        where.append("j.suite = ?")
        params.append(suite)
    if job_ids is not None:
        where.append(f"j.id IN ({','.join('?' * len(job_ids))})" if job_ids else "0")
        params.extend(job_ids)
    if where:
        sql += " WHERE " + " AND ".join(where)
    out: list[ResultJob] = []
    for r in store.query(sql + " ORDER BY j.id", params):
        out.append(ResultJob(
            r["job_id"], r["suite"], r["config_name"], r["data"], r["seed"], r["n"], r["level"], r["level_step"],
            json_column(r["overrides_json"], {}), bool(r["run_alone"]), r["run_dir"],
            r["output_metrics_json"], r["job_overrides_json"] or "{}", r["setting_json"] or "{}",
            r["config_path"] or "", r["env_json"] or "{}", r["worker"] or "", _STATES[r["state"]], r["reason"],
            _names(r["inexact_rungs_json"]), r["not_science_json"] or "[]", r["diverged"], r["provenance_json"],
            r["level_note"], r["reported_json"], r["ended_at"], r["attempt_reason"],
        ))  # fmt: skip
    return out
