"""An attempt's end as one transaction: what its shape learned (memory, prompt length) and the
attempt closed with its job's next state, so a daemon killed halfway applies neither or both
(an OOM floor grows by x1.25 per OOM: applied twice, it would overshoot). Also the reads the
end is decided from, and the config or suite pause it may lead to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator import faults
from orchestrator.lifecycle import AttemptOutcome, KillRequest
from orchestrator.plans.model import ShareBase
from orchestrator.store.attempts import (
    AttemptEnd,
    finish_attempt,
    read_attempt,
    read_shape,
    record_prompt_length,
    write_shape,
)
from orchestrator.store.db import Store
from orchestrator.store.jobs import add_event
from orchestrator.store.learning import label_shape
from orchestrator.store.rows import Attempt, FamilyTag, ShapeMemory


@dataclass(frozen=True)
class ShapeLesson:
    """What a finished attempt teaches its shape: `fold` turns the stored record into the new one."""

    shape_key: str
    fold: Callable[[ShapeMemory | None], ShapeMemory]
    suite: str
    label: str  # the config, level and task, shown by `orch memory`
    family: FamilyTag | None = None  # where the shape sits in its memory family


@dataclass(frozen=True)
class PromptLesson:
    length_key: str
    longest_tokens: int


class StopAskedMeanwhile(Exception):
    """A user's stop request (cancel, retry) reached the attempt after its end was decided from
    a read without it: nothing was written; decide again from the attempt as it is now."""


def close_attempt(
    store: Store, attempt: Attempt, end: AttemptEnd, *, shape: ShapeLesson | None = None,
    prompt: PromptLesson | None = None, kill_seen: bool = False,
) -> bool:
    """Learn from the attempt and close it, in one transaction; nothing is learned when another
    writer closed it first. False then. With `kill_seen`, the end was decided from
    `attempt.kill_requested`: a different request stored since raises StopAskedMeanwhile."""
    with store.write():
        rows = store.query(
            "SELECT kill_requested FROM attempts WHERE id = ? AND outcome IS NULL", [attempt.id]
        )
        if not rows:
            return False
        stored = rows[0]["kill_requested"]
        seen = attempt.kill_requested.value if attempt.kill_requested is not None else None
        if kill_seen and stored != seen:
            raise StopAskedMeanwhile(f"attempt {attempt.id}: {stored} asked while its end was read")
        if shape is not None:
            write_shape(store, shape.shape_key, shape.fold(read_shape(store, shape.shape_key)))
            label_shape(store, shape.shape_key, shape.suite, shape.label, shape.family)
        if prompt is not None:
            record_prompt_length(store, prompt.length_key, prompt.longest_tokens)
        faults.reach("after_learn")
        return finish_attempt(store, attempt, end)


def neighbours(store: Store, attempt: Attempt, within_s: float = 5.0) -> list[dict[str, Any]]:
    """The attempts on the same card, live or ended in the last `within_s` (for an OOM's event)."""
    rows = store.query(
        "SELECT a.job_id, a.held_mib, a.peak_mib, j.config_name FROM attempts a JOIN jobs j ON j.id = a.job_id "
        "WHERE a.gpu_index = ? AND a.id != ? AND (a.outcome IS NULL OR a.ended_at >= ?)",
        [attempt.gpu_index, attempt.id, store.now_s() - within_s],
    )
    return [
        {
            "job": r["job_id"],
            "config": r["config_name"],
            "held_mib": r["held_mib"],
            "peak_mib": r["peak_mib"],
        }
        for r in rows
    ]


def hung_attempts_before(store: Store, attempt: Attempt) -> int:
    """Earlier attempts of the attempt's job that failed because orch killed them as hung."""
    return int(store.query(
        "SELECT count(*) AS n FROM attempts WHERE job_id = ? AND kill_requested = ? AND outcome = ? AND id != ?",
        [attempt.job_id, KillRequest.HUNG.value, AttemptOutcome.FAILED.value, attempt.id],
    )[0]["n"])


def recent_failure_durations(store: Store, suite: str, config: str, since_s: float, until_s: float) -> list[float]:
    """How long each failed attempt of the suite's config that ended between `since_s` and
    `until_s` ran (hung ones, killed by orch, left out; one fused process's death once). One
    stamped after `until_s` (now) ended before a wall-clock step back, at a time that cannot be
    told: left out."""
    rows = store.query(
        "SELECT a.started_at, a.ended_at, a.share_mode, a.share_process, a.share_pid FROM attempts a "
        "JOIN jobs j ON j.id = a.job_id "
        "WHERE j.suite = ? AND j.config_name = ? AND a.outcome = ? AND a.ended_at >= ? AND a.ended_at <= ? "
        "AND a.kill_requested IS NOT ? ORDER BY a.ended_at, a.id",
        [suite, config, AttemptOutcome.FAILED.value, since_s, until_s, KillRequest.HUNG.value],
    )
    return once_per_process([
        Failure((r["ended_at"] or 0) - r["started_at"], r["ended_at"] or 0, r["share_mode"], r["share_process"],
                r["share_pid"])
        for r in rows
    ])


# A fused process's death fails its members within moments of each other (each client sees the
# process end and exits); failures of one process further apart are crashes of their own.
GROUP_DEATH_WINDOW_S = 10.0


@dataclass(frozen=True)
class Failure:
    """One failed attempt as the crash-loop guard counts it: its length, when it ended, and the
    warm process its share.json named (mode, process, pid; None without one)."""

    length_s: float
    ended_at_s: float
    share_mode: str | None
    process: str | None
    pid: int | None


def once_per_process(failures: list[Failure]) -> list[float]:
    """Each failure's length (in the order given, by end time), the members of one fused process
    (share.json's mode `fused`, one process and pid) that failed within GROUP_DEATH_WINDOW_S of
    that process's last counted failure once: one process's death fails every job it trained
    at once, and counts as one crash. A sequential warm process trains its jobs one after
    another under one pid, so each of its failures is a crash of its own config: each counts,
    as do fused failures of one process further apart."""
    counted_at: dict[tuple[str, int], float] = {}
    lengths = []
    for f in failures:
        if f.share_mode == ShareBase.FUSED.value and f.process is not None and f.pid is not None:
            key = (f.process, f.pid)
            first_s = counted_at.get(key)
            if first_s is not None and 0 <= f.ended_at_s - first_s <= GROUP_DEATH_WINDOW_S:
                continue
            counted_at[key] = f.ended_at_s
        lengths.append(f.length_s)
    return lengths


def pause_config(store: Store, suite: str, config: str, reason: str, message: str) -> bool:
    """Pause one config of the suite (none of its jobs starts until resumed), with its event;
    False when it was paused already."""
    with store.write():
        cursor = store.execute(
            "INSERT OR IGNORE INTO paused_configs (suite, config_name, reason, paused_at) VALUES (?, ?, ?, ?)",
            [suite, config, reason, store.now_s()],
        )
        if not cursor.rowcount:
            return False
        add_event(store, "pause", message)
    return True


def unpaused_configs(store: Store, suite: str) -> list[str]:
    """The suite's configs (those it has jobs of) that are not paused: while there is one, the
    suite itself is not paused."""
    rows = store.query(
        "SELECT DISTINCT config_name FROM jobs WHERE suite = ? AND config_name NOT IN "
        "(SELECT config_name FROM paused_configs WHERE suite = ?) ORDER BY config_name", [suite, suite],
    )
    return [r["config_name"] for r in rows]


def pause_suite(store: Store, suite: str, reason: str, message: str) -> bool:
    """Pause the suite (nothing of it starts until resumed), with its event; False when it was paused already."""
    with store.write():
        cursor = store.execute(
            "INSERT OR IGNORE INTO paused_suites (suite, reason, paused_at) VALUES (?, ?, ?)",
            [suite, reason, store.now_s()],
        )
        if not cursor.rowcount:
            return False
        add_event(store, "pause", message)
    return True


def mark_hung(store: Store, attempt: Attempt, message: str) -> Attempt:
    """Record that orch kills the attempt as hung, with its event, in one transaction; returns
    the attempt as now stored. Marked already (by a daemon that died before killing it), or a
    cancel or retry asked for since the pass read the row: left as it is, no event."""
    with store.write():
        cursor = store.execute(
            "UPDATE attempts SET kill_requested = ? WHERE id = ? AND kill_requested IS NULL",
            [KillRequest.HUNG.value, attempt.id],
        )
        if cursor.rowcount:
            add_event(store, "hung", message, job_id=attempt.job_id, attempt_id=attempt.id)
        fresh = read_attempt(store, attempt.id)
    assert fresh is not None  # updated just now, in this transaction
    return fresh
