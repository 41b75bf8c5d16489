"""Writes behind the user's control actions (cancel, retry, resume), for the CLI and the web page."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.lifecycle import KillRequest
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
        rows = store.query("SELECT id, pid, proc_create_time FROM attempts WHERE job_id = ? AND outcome IS NULL", [job_id])
        if not rows:
            return None
        store._db.execute("UPDATE attempts SET kill_requested = ? WHERE id = ?", [why.value, rows[0]["id"]])
        add_event(store, why.value, f"{why.value} requested by user", job_id=job_id, attempt_id=rows[0]["id"])
    return LiveProcess(rows[0]["id"], rows[0]["pid"], rows[0]["proc_create_time"])


def unpause_suite(store: Store, suite: str) -> bool:
    """Lift the crash-loop pause of `suite`; False when it was not paused."""
    with store.write():
        cursor = store._db.execute("DELETE FROM paused_suites WHERE suite = ?", [suite])
        if not cursor.rowcount:
            return False
        add_event(store, "resume", f"suite {suite} resumed by user")
    return True


def request_daemon_stop(store: Store, *, drain: bool = False) -> None:
    """Ask the daemon to exit now (its workers keep running), or with `drain` to start nothing
    new and exit when its running jobs have ended. It reads the flag at its next tick."""
    with store.write():
        store._db.execute(f"UPDATE daemon SET {'draining' if drain else 'stop_requested'} = 1 WHERE id = 1")
