"""What early stopping reads and writes: the jobs of suites with an `early_stop:` rule, their
metric at each step, the pruner's record of each setting's value at each rung (read back after a
restart), and the stop of a pruned setting (its running jobs asked to stop, its queued ones
pruned at once), each in one transaction."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.lifecycle import JobState, KillRequest
from orchestrator.plans.early_stop import Mode
from orchestrator.store.db import Store
from orchestrator.store.jobs import add_event, transition
from orchestrator.store.rows import Job

_GROUPS_RUNNING = (
    "SELECT * FROM jobs WHERE early_stop_json != '{}' AND (suite, data) IN "
    "(SELECT suite, data FROM jobs WHERE state = 'running' AND early_stop_json != '{}') ORDER BY id"
)


@dataclass(frozen=True)
class RungValue:
    """A setting's value at one rung, as the pruner was told it."""

    setting: str
    rung: int
    step: float
    value: float


def early_stop_jobs(store: Store) -> list[Job]:
    """Every job of each (suite, task) with an early_stop rule and a job running now."""
    return [Job.from_row(row) for row in store.query(_GROUPS_RUNNING)]


_ATTEMPTS_OF = "SELECT id FROM attempts WHERE job_id = ?"


def metric_last_steps(store: Store, job_ids: Sequence[int], key: str) -> dict[int, float]:
    """job id -> the furthest step `key` was reported at (an index seek per attempt)."""
    found: dict[int, float] = {}
    for job_id in job_ids:
        (step,) = store.execute(
            f"SELECT max(step) FROM metric_history WHERE key = ? AND attempt_id IN ({_ATTEMPTS_OF})",
            [key, job_id],
        ).fetchone()
        if step is not None:
            found[job_id] = float(step)
    return found


def metric_points_at(
    store: Store, job_ids: Sequence[int], key: str, steps: Sequence[float], last_n: int = 1,
    best_of: Mode | None = None,
) -> dict[int, dict[float, float]]:
    """job id -> {step: value} holding, for each of `steps`, the job's last `last_n` values of
    `key` at or before it, and its value at the furthest step reported: what early stopping
    needs of a history, read by index seeks (a later attempt's value wins at a step both
    reported). With `best_of` (the direction that is better) the best value between each two
    of `steps` too (each stretch of the history scanned once: the best at or before a step is
    the best of the stretches up to it), among the values no later attempt replaced: as a
    stitched curve keeps them, an attempt's values from a later attempt's first step on are
    left out."""
    points: dict[int, dict[float, float]] = {job_id: {} for job_id in job_ids}
    sql = (
        "SELECT h.step, h.value FROM metric_history h JOIN attempts a ON a.id = h.attempt_id "
        "WHERE a.job_id = ? AND h.key = ? AND h.step <= ? AND h.step < ? "
        "ORDER BY h.step DESC, a.n DESC LIMIT 1"
    )
    best_sql = (
        "SELECT h.step, h.value FROM metric_history h JOIN attempts a ON a.id = h.attempt_id "
        "WHERE a.job_id = ? AND h.key = ? AND h.step > ? AND h.step <= ? AND NOT EXISTS ("
        "SELECT 1 FROM metric_history l JOIN attempts b ON b.id = l.attempt_id "
        "WHERE b.job_id = a.job_id AND b.n > a.n AND l.key = h.key AND l.step <= h.step) "
        f"ORDER BY h.value {'ASC' if best_of is Mode.MIN else 'DESC'}, h.step DESC LIMIT 1"
    )
    for job_id in job_ids:
        for step in [*steps, float("inf")]:
            below = float("inf")  # each seek the step before the one found last: steps distinct
            for _ in range(last_n if step != float("inf") else 1):
                row = store.execute(sql, [job_id, key, step, below]).fetchone()
                if row is None:
                    break
                below = float(row[0])
                points[job_id][below] = float(row[1])
        if best_of is None:
            continue
        after = float("-inf")
        for step in sorted(steps):
            row = store.execute(best_sql, [job_id, key, after, step]).fetchone()
            if row is not None:
                points[job_id][float(row[0])] = float(row[1])
            after = step
    return points


def reached_steps(store: Store, job_ids: Sequence[int]) -> dict[int, float]:
    """job id -> the furthest step any of its metrics was reported at."""
    if not job_ids:
        return {}
    rows = store.query(
        "SELECT a.job_id AS job_id, max(h.step) AS step FROM metric_history h JOIN attempts a ON a.id = h.attempt_id "
        f"WHERE a.job_id IN ({','.join('?' * len(job_ids))}) GROUP BY a.job_id",
        list(job_ids),
    )
    return {int(row["job_id"]): float(row["step"]) for row in rows}


def reported_keys(store: Store, job_ids: Sequence[int], most: int = 12) -> list[str]:
    """The metric keys the jobs' attempts reported over steps, sorted (at most `most`)."""
    if not job_ids:
        return []
    rows = store.query(
        "SELECT DISTINCT h.key AS key FROM metric_history h JOIN attempts a ON a.id = h.attempt_id "
        f"WHERE a.job_id IN ({','.join('?' * len(job_ids))}) ORDER BY h.key LIMIT ?",
        [*job_ids, most],
    )
    return [str(row["key"]) for row in rows]


def rule_key(rule: Mapping[str, Any]) -> str:
    """The stored form of an early_stop rule that rung values are kept under (keys sorted)."""
    return json.dumps(rule, sort_keys=True)


def read_rungs(store: Store, suite: str, data: str, rule: Mapping[str, Any]) -> list[RungValue]:
    """What the pruner was told under `rule`; values told under another rule (the suite was
    resubmitted with another one) are other steps or another metric, and are left out."""
    rows = store.query(
        "SELECT setting, rung, step, value FROM early_stop_rungs WHERE suite = ? AND data = ? "
        "AND rule_json = ? ORDER BY rung, setting",
        [suite, data, rule_key(rule)],
    )
    return [
        RungValue(str(r["setting"]), int(r["rung"]), float(r["step"]), float(r["value"]))
        for r in rows
    ]


def record_rungs(
    store: Store, suite: str, data: str, rule: Mapping[str, Any], rungs: Iterable[RungValue]
) -> None:
    """Keep what the pruner was told under `rule`; a rung already recorded keeps its first value.
    Values told under another rule are dropped first: the new rule's take their place."""
    key = rule_key(rule)
    rows = [(suite, data, r.setting, r.rung, r.step, r.value, key) for r in rungs]
    if rows:
        with store.write():
            store.execute(
                "DELETE FROM early_stop_rungs WHERE suite = ? AND data = ? AND rule_json != ?",
                [suite, data, key],
            )
            store.executemany(
                "INSERT OR IGNORE INTO early_stop_rungs (suite, data, setting, rung, step, value, rule_json) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )


def newest_rules(store: Store, suite: str) -> dict[str, dict[str, Any]]:
    """Per task, the early_stop rule stored with the suite's newest job on it that has one (a
    suite and task are judged by that rule)."""
    rows = store.execute(
        "SELECT data, early_stop_json FROM jobs WHERE suite = ? AND early_stop_json != '{}' ORDER BY id",
        [suite],
    ).fetchall()
    rules: dict[str, dict[str, Any]] = {}
    for data, stored in rows:  # the newest wins
        rule = json.loads(stored) if isinstance(stored, str) else None
        if isinstance(rule, dict):
            rules[str(data)] = rule
    return rules


def stopped_settings(store: Store, suite: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The suite's settings early stopping has stopped, keyed (task, config name, overrides as
    stored): the record of the newest job stopped in each. One read, whatever the suite's size."""
    rows = store.execute(
        "SELECT data, config_name, overrides_json, pruned_json FROM jobs WHERE suite = ? "
        "AND pruned_json IS NOT NULL AND pruned_json NOT IN ('', '{}') ORDER BY id",
        [suite],
    ).fetchall()
    stopped: dict[tuple[str, str, str], dict[str, Any]] = {}
    for data, config_name, overrides_json, stored in rows:  # the newest stopped job's record wins
        record = json.loads(stored) if isinstance(stored, str) else None
        if isinstance(record, dict):
            stopped[(str(data), str(config_name), str(overrides_json))] = record
    return stopped


def prune_jobs(
    store: Store, job_ids: Sequence[int], record: dict[str, Any], why: str
) -> tuple[list[int], list[int]]:
    """Stop a pruned setting's jobs: each running one's live attempt is asked to stop (the
    daemon stops it as a cancel, SIGTERM then SIGKILL, and its job ends pruned), each queued one
    ends pruned now; `record` (step, metric, value, rank) is kept on each. Returns (stopping,
    pruned now); jobs in any other state are left as they are."""
    stopping: list[int] = []
    pruned: list[int] = []
    stored = json.dumps(record, sort_keys=True)
    with store.write():
        for job_id in job_ids:
            row = store._db.execute("SELECT state FROM jobs WHERE id = ?", [job_id]).fetchone()
            state = JobState(row[0]) if row is not None else None
            if state is JobState.QUEUED:
                transition(
                    store,
                    job_id,
                    JobState.PRUNED,
                    message=why,
                    kind="prune",
                    expect_from=[JobState.QUEUED],
                    fields={"reason": why, "wait_reason": None, "pruned_json": stored},
                    data=record,
                )
                pruned.append(job_id)
            elif state is JobState.RUNNING:
                live = store._db.execute(
                    "SELECT id FROM attempts WHERE job_id = ? AND outcome IS NULL", [job_id]
                ).fetchone()
                if live is None:
                    continue  # ending now: its next state is decided without the prune
                asked = store._db.execute(
                    "UPDATE attempts SET kill_requested = ? WHERE id = ? AND kill_requested IS NULL",
                    [KillRequest.PRUNE.value, live[0]],
                )
                if asked.rowcount != 1:
                    continue  # a cancel, retry or hang kill was asked first: it ends as that asked
                store._db.execute("UPDATE jobs SET pruned_json = ? WHERE id = ?", [stored, job_id])
                add_event(
                    store,
                    "prune",
                    f"{why}: stopping it",
                    job_id=job_id,
                    attempt_id=live[0],
                    data=record,
                )
                stopping.append(job_id)
    return stopping, pruned


def where(suite: str, data: str) -> str:
    """`suite on task`, or the suite alone where its jobs have no task (a script without one)."""
    return f"{suite} on {data}" if data else suite


def warn_early_stop(store: Store, suite: str, data: str, message: str) -> None:
    with store.write():
        add_event(store, "early_stop", f"{where(suite, data)}: {message}")


def unreported_metrics(store: Store, suite: str | None = None) -> list[str]:
    """A line for each suite and task (of `suite`) whose early_stop metric (its newest job's
    rule) no job has reported although one has passed the first rung: nothing was stopped there.
    Read from the history as it is now, so a metric that came later, or a rule since mended,
    says nothing."""
    rows = store.query(
        "SELECT id, suite, data, early_stop_json FROM jobs WHERE early_stop_json != '{}'"
        + (" AND suite = ?" if suite is not None else "") + " ORDER BY id",
        [suite] if suite is not None else [],
    )
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((str(row["suite"]), str(row["data"])), []).append(row)
    lines = []
    for (name, data), jobs in groups.items():
        try:
            rule = json.loads(jobs[-1]["early_stop_json"])
            metric, min_steps = str(rule["metric"]), float(rule["min_steps"])
        except (ValueError, KeyError, TypeError):
            continue
        ids = [int(job["id"]) for job in jobs]
        if metric_last_steps(store, ids, metric) or max(reached_steps(store, ids).values(), default=0.0) < min_steps:
            continue
        keys = reported_keys(store, ids)
        lines.append(f"{where(name, data)}: early_stop metric {metric!r} was never reported, so nothing was stopped "
                     f"(reported: {', '.join(keys) or 'nothing'})")
    return lines

