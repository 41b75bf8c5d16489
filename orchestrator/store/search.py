"""What a TPE search reads and writes: its suite's trial jobs, each job's final value of the
search metric, and a new trial's jobs, written in one transaction only while the search has
fewer trials than it asks for (so no trial is ever queued twice, whatever restarts)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.errors import PlanError
from orchestrator.lifecycle import JobState
from orchestrator.plans.search import Search
from orchestrator.store.db import Store
from orchestrator.store.jobs import add_event
from orchestrator.store.rows import Job

_TPE_JOBS = (  # the cheap test first: most jobs are in no search
    "SELECT * FROM jobs WHERE search_json != '{}' AND json_extract(search_json, '$.spec.method') = 'tpe' "
    "ORDER BY id"
)
# copied from a template job as they are; the rest of a new job is written below
_COPIED = (
    "suite",
    "config_name",
    "config_path",
    "seed",
    "data",
    "env_json",
    "worker",
    "declared_mib",
    "allowed_gpus_json",
    "priority",
    "one_token",
    "ladder_json",
    "hang_timeout_s",
    "crash_loop_failures",
    "crash_loop_within_s",
    "crash_loop_window_s",
    "worker_output_json",
    "memory_keys_json",
    "min_stack_gain",
    "slurm_json",
    "gpus",
    "cpus",
    "not_science_json",
    "early_stop_json",
)


def tpe_search_jobs(store: Store) -> list[Job]:
    return [Job.from_row(row) for row in store.query(_TPE_JOBS)]


def final_values(store: Store, job_ids: Sequence[int], key: str) -> dict[int, float]:
    """job id -> `key` at the last step its latest attempt reported it (its final value)."""
    if not job_ids:
        return {}
    rows = store.query(
        "SELECT a.job_id AS job_id, h.value AS value FROM metric_history h JOIN attempts a ON a.id = h.attempt_id "
        f"WHERE a.job_id IN ({','.join('?' * len(job_ids))}) AND h.key = ? ORDER BY a.job_id, a.n, h.step",
        [*job_ids, key],
    )
    return {
        int(row["job_id"]): float(row["value"]) for row in rows
    }  # the last row of each job wins


def _identity(row: Mapping[str, Any], config: dict[str, Any], overrides: dict[str, Any]) -> str:
    payload = json.dumps(
        {
            "suite": row["suite"],
            "config": row["config_name"],
            "content": config,
            "seed": row["seed"],
            "data": row["data"],
            "overrides": overrides,
        },
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def _spec_key(spec: Mapping[str, Any]) -> str:
    """A search's spec but for its `trials`, as text to compare: read back as a Search (an
    integer bound an older version stored as 1.0 reads as 1) with its keys sorted; 1, 1.0 and
    true stay apart, as they do in a job's config."""
    try:
        normal = Search.from_json(dict(spec)).to_json()
    except (PlanError, KeyError, TypeError, ValueError, AttributeError):
        normal = dict(spec)  # unreadable: compared as stored
    return json.dumps({k: v for k, v in normal.items() if k != "trials"}, sort_keys=True)


def _same_search(store: Store, suite: str, spec: Mapping[str, Any]) -> list[tuple[int, int | None, int | None]]:
    """(job id, its trial, the search's `trials`) of each job of the suite's search of `spec`
    (of its method, but for its `trials`)."""
    rows = store.execute(
        "SELECT id, json_extract(search_json, '$.spec'), json_extract(search_json, '$.trial'), "
        "json_extract(search_json, '$.spec.trials') FROM jobs WHERE suite = ? AND search_json != '{}'",
        [suite],
    ).fetchall()
    wanted = _spec_key(spec)
    keys: dict[str, str] = {}  # one reading of each distinct stored spec
    same = []
    for job_id, stored, trial, trials in rows:
        if stored not in keys:
            held = json.loads(stored) if isinstance(stored, str) else None
            keys[stored] = _spec_key(held) if isinstance(held, dict) else ""
        if keys[stored] == wanted:
            same.append((int(job_id), int(trial) if trial is not None else None,
                         int(trials) if trials is not None else None))
    return same


def _asked(store: Store, suite: str, spec: Mapping[str, Any]) -> tuple[set[int], int | None]:
    """The trial numbers the suite's search of `spec` (but for its `trials`) has asked, and
    the `trials` it has now (None: no such search)."""
    same = _same_search(store, suite, spec)
    numbers = {trial for _, trial, _ in same if trial is not None}
    return numbers, max((trials for _, _, trials in same if trials is not None), default=None)


def queue_trial(
    store: Store, templates: Sequence[Job], params: dict[str, Any], number: int
) -> list[int]:
    """Queue trial `number` of the templates' search: one job per template (each config, seed and
    task of its first trial) with `params` in its config and overrides. Nothing is written when
    the search already has its `trials`, or a trial of that number: the ids queued, else []."""
    if not templates:
        return []
    search = dict(templates[0].search)
    queued: list[int] = []
    with store.write():
        # the search's trials and `trials` as they are now: a submit may have changed `trials`
        # since the templates were read (the same search: its spec but for `trials`)
        numbers, now_trials = _asked(store, templates[0].suite, search["spec"])
        trials = now_trials if now_trials is not None else int(search["spec"]["trials"])
        if number in numbers or len(numbers) >= trials:
            return []
        search["spec"] = {**search["spec"], "trials": trials}
        now = store.now_s()
        for template in templates:
            row = store._db.execute(
                f"SELECT {', '.join(_COPIED)} FROM jobs WHERE id = ?", [template.id]
            ).fetchone()
            copied = dict(zip(_COPIED, row, strict=True))
            config = {**template.config, **params}
            overrides = {**template.overrides, **params}
            fields = {
                **copied,
                "identity": _identity(copied, config, overrides),
                "config_json": json.dumps(config, sort_keys=True),
                "overrides_json": json.dumps(overrides, sort_keys=True),
                "state": JobState.QUEUED.value,
                "max_attempts": int(search.get("max_attempts") or template.max_attempts),
                "queued_at": now,
                "created_at": now,
                "updated_at": now,
                "search_json": json.dumps({**search, "trial": number}, sort_keys=True),
            }
            cursor = store._db.execute(
                f"INSERT INTO jobs ({', '.join(fields)}) VALUES ({', '.join('?' * len(fields))})",
                list(fields.values()),
            )
            job_id = int(cursor.lastrowid or 0)
            shown = ", ".join(f"{k}={v}" for k, v in params.items())
            add_event(
                store,
                "submitted",
                f"queued trial {number} of the {template.suite} search (tpe): {shown}, "
                f"{template.config_name} seed {template.seed}" + (f" on {template.data}" if template.data else ""),
                job_id=job_id,
                to_state=JobState.QUEUED.value,
            )
            queued.append(job_id)
    return queued


def submitted_before(store: Store, suite: str, spec: Mapping[str, Any]) -> tuple[int, int] | None:
    """The suite's TPE search of `spec` (but for its `trials`), submitted before: (its trials
    asked so far, the `trials` it has); None when the suite has no such search."""
    numbers, trials = _asked(store, suite, spec)
    return None if trials is None else (len(numbers), trials)


def other_search(store: Store, suite: str, spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """The spec of a search the suite already holds that differs from `spec` in more than its
    `trials`; None when it holds no search, or only this one."""
    rows = store.execute(
        "SELECT DISTINCT json_extract(search_json, '$.spec') FROM jobs WHERE suite = ? AND search_json != '{}'",
        [suite],
    ).fetchall()
    wanted = _spec_key(spec)
    for (stored,) in rows:
        held = json.loads(stored) if isinstance(stored, str) else None
        if isinstance(held, dict) and _spec_key(held) != wanted:
            return held
    return None


def set_search_trials(store: Store, suite: str, spec: Mapping[str, Any]) -> None:
    """The search takes `spec`'s `trials`: one extended goes on asking, one cut short asks no more."""
    with store.write():
        ids = [job_id for job_id, _, _ in _same_search(store, suite, spec)]
        for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
            store.execute(
                "UPDATE jobs SET search_json = json_set(search_json, '$.spec.trials', ?) "
                f"WHERE id IN ({','.join('?' * len(chunk))})",
                [int(spec["trials"]), *chunk],
            )


def suite_search_jobs(store: Store, suite: str) -> list[Job]:
    """The jobs of the suite's search trials (of any method), by id."""
    rows = store.query(
        "SELECT * FROM jobs WHERE suite = ? AND search_json != '{}' ORDER BY id", [suite]
    )
    return [Job.from_row(row) for row in rows]


def searched_suites(store: Store) -> list[str]:
    """The suites with search trials, by name."""
    return [
        str(r["suite"])
        for r in store.query(
            "SELECT DISTINCT suite FROM jobs WHERE search_json != '{}' ORDER BY suite"
        )
    ]
