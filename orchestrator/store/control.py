"""Writes behind the user's control actions (cancel, retry, resume), for the CLI and the web page."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.lifecycle import JobState, KillRequest
from orchestrator.store.db import Store
from orchestrator.store.jobs import add_event


@dataclass(frozen=True)
class LiveProcess:
    attempt_id: int
    pid: int | None  # the wrapper as the launcher started it (it leads its own process group)
    proc_create_time: float | None


def request_stop(store: Store, job_id: int, why: KillRequest) -> LiveProcess | None:
    """Mark the job's live attempt to be stopped (`why`: cancel or retry), with its event.
    Returns its wrapper process, or None when the job has no live attempt."""
    with store.write():
        rows = store.query(
            "SELECT id, pid, proc_create_time FROM attempts WHERE job_id = ? AND outcome IS NULL",
            [job_id],
        )
        if not rows:
            return None
        store._db.execute("UPDATE attempts SET kill_requested = ? WHERE id = ?", [why.value, rows[0]["id"]])
        add_event(store, why.value, f"{why.value} requested by user", job_id=job_id, attempt_id=rows[0]["id"])
    return LiveProcess(rows[0]["id"], rows[0]["pid"], rows[0]["proc_create_time"])


def start_fresh(store: Store, job_id: int, while_in: JobState) -> bool:
    """The job's next attempt resumes from none of the attempts it has had so far. Written only
    while the job is still `while_in` (the state its caller read): False, with nothing written,
    when it moved since."""
    with store.write():
        cursor = store._db.execute("UPDATE jobs SET fresh_after_attempt = attempt_count WHERE id = ? AND state = ?",
                                   [job_id, while_in.value])
        if cursor.rowcount != 1:
            return False
        add_event(store, "retry", "its next attempt starts fresh: no earlier checkpoint is resumed from", job_id=job_id)
    return True


def _lift_pauses(store: Store, suite: str) -> str | None:
    """Delete the suite's pause and its configs' (inside a write): what was lifted, in words
    (None: nothing was paused)."""
    configs = [r["config_name"] for r in store.query(
        "SELECT config_name FROM paused_configs WHERE suite = ? ORDER BY config_name", [suite])]
    store._db.execute("DELETE FROM paused_configs WHERE suite = ?", [suite])
    suite_paused = bool(store._db.execute("DELETE FROM paused_suites WHERE suite = ?", [suite]).rowcount)
    if not configs:
        return f"suite {suite}" if suite_paused else None
    return f"suite {suite} (paused config{'s' if len(configs) > 1 else ''}: {', '.join(configs)})"


def unpause_suite(store: Store, suite: str) -> bool:
    """Lift the crash-loop pause of `suite` and of every config of it; False when nothing of it
    was paused."""
    with store.write():
        lifted = _lift_pauses(store, suite)
        if lifted is None:
            return False
        add_event(store, "resume", f"{lifted} resumed by user")
    return True


def request_daemon_stop(store: Store, *, drain: bool = False) -> None:
    """Ask the daemon to exit now (its workers keep running), or with `drain` to start nothing
    new and exit when its running jobs have ended. It reads the flag at its next tick."""
    with store.write():
        store._db.execute(f"UPDATE daemon SET {'draining' if drain else 'stop_requested'} = 1 WHERE id = 1")


@dataclass(frozen=True)
class JobCommand:
    """How a job's worker is started: what a retry takes from the suite file as it is now."""

    worker: str
    env_json: str
    worker_output_json: str
    hang_timeout_s: float


def job_command(store: Store, job_id: int) -> JobCommand:
    row = store.query("SELECT worker, env_json, worker_output_json, hang_timeout_s FROM jobs WHERE id = ?", [job_id])[0]
    return JobCommand(
        row["worker"],
        row["env_json"] or "{}",
        row["worker_output_json"] or "{}",
        float(row["hang_timeout_s"]),
    )


def set_job_command(store: Store, job_id: int, command: JobCommand, message: str) -> None:
    """Start the job's next attempts with `command` (its suite file changed since submit)."""
    with store.write():
        store._db.execute(
            "UPDATE jobs SET worker = ?, env_json = ?, worker_output_json = ?, hang_timeout_s = ? WHERE id = ?",
            [command.worker, command.env_json, command.worker_output_json, command.hang_timeout_s, job_id],
        )
        add_event(store, "retry", message, job_id=job_id)


def worker_of_last_failure(store: Store, suite: str) -> str | None:
    """The worker command of the suite's job that failed last (what a crash-loop pause ran)."""
    rows = store.query(
        "SELECT j.worker FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE j.suite = ? AND a.outcome = 'failed' "
        "ORDER BY a.ended_at DESC LIMIT 1", [suite],
    )
    return rows[0]["worker"] if rows else None


def resume_changed_suite(store: Store, suite: str, why: str) -> None:
    """Lift the crash-loop pauses of the suite and its configs because what failed was changed (`why`)."""
    with store.write():
        lifted = _lift_pauses(store, suite)
        if lifted is not None:
            add_event(store, "resume", f"{lifted} resumed: {why}")
