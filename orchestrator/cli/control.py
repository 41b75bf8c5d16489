"""`orch cancel`, `orch retry`, `orch resume`, `orch attach`: changing what runs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import click

from orchestrator.cli.common import db_option, echo_json, json_option, open_store, parse_job_ids
from orchestrator.daemon_state import daemon_alive, tmux_socket_name
from orchestrator.errors import UsageError
from orchestrator.lifecycle import JobState
from orchestrator.reconcile import group_is_ours
from orchestrator.store.db import Store
from orchestrator.store.jobs import add_event, cancel_queued, transition
from orchestrator.store.queries import get_job


def _select(store: Store, job_args: tuple[str, ...], suite: str | None, all_jobs: bool, states: tuple[str, ...]) -> list[int]:
    if sum(bool(x) for x in (job_args, suite, all_jobs)) != 1:
        raise UsageError("give job ids, --suite S or --all (exactly one of them)")
    if job_args:
        ids = parse_job_ids(job_args)
        for job_id in ids:
            get_job(store, job_id)
        return ids
    marks = ",".join("?" * len(states))
    if suite:
        rows = store.query(f"SELECT id FROM jobs WHERE suite = ? AND state IN ({marks}) ORDER BY id", [suite, *states])
    else:
        rows = store.query(f"SELECT id FROM jobs WHERE state IN ({marks}) ORDER BY id", list(states))
    return [r["id"] for r in rows]


def _stop_running(store: Store, job_id: int, why: str) -> bool:
    """Ask for the live attempt to be stopped; the daemon records the end. Without a daemon,
    kill the process group here so nothing keeps running unseen."""
    with store.write():
        # pid/proc_create_time: the wrapper as the launcher started it (it leads its own group)
        rows = store.query("SELECT id, pid, proc_create_time FROM attempts WHERE job_id = ? AND outcome IS NULL", [job_id])
        if not rows:
            return False
        store.db.execute("UPDATE attempts SET kill_requested = ? WHERE id = ?", [why, rows[0]["id"]])
        add_event(store, why, f"{why} requested by user", job_id=job_id, attempt_id=rows[0]["id"])
    pid, create_time = rows[0]["pid"], rows[0]["proc_create_time"]
    if daemon_alive(store) is None and pid and create_time is not None and group_is_ours(pid, create_time):
        from orchestrator.launch.base import kill_process_group

        kill_process_group(int(pid))
    return True


@click.command("cancel")
@click.argument("jobs", nargs=-1)
@click.option("--suite", default=None, help="Cancel every queued or running job of a suite.")
@click.option("--all", "all_jobs", is_flag=True, help="Cancel every queued or running job.")
@json_option
@db_option
def cancel_cmd(jobs: tuple[str, ...], suite: str | None, all_jobs: bool, as_json: bool, db_path: Path) -> None:
    """Cancel queued jobs; stop running ones (their whole process group)."""
    cancelled: list[int] = []
    stopping: list[int] = []
    skipped: list[dict[str, object]] = []
    with open_store(db_path) as store:
        for job_id in _select(store, jobs, suite, all_jobs, ("queued", "running")):
            state = get_job(store, job_id)["state"]
            if state == JobState.QUEUED.value:
                cancel_queued(store, job_id, "cancelled by user")
                cancelled.append(job_id)
            elif state == JobState.RUNNING.value and _stop_running(store, job_id, "cancel"):
                stopping.append(job_id)
            else:
                skipped.append({"id": job_id, "state": state})
    if as_json:
        echo_json({"cancelled": cancelled, "stopping": stopping, "skipped": skipped})
        return
    click.echo(f"cancelled {len(cancelled)} queued job(s); stopping {len(stopping)} running job(s)")
    for item in skipped:
        click.echo(f"  job {item['id']} is {item['state']}: nothing to cancel")


@click.command("retry")
@click.argument("jobs", nargs=-1)
@click.option("--suite", default=None, help="Requeue every failed or cancelled job of a suite.")
@click.option("--all", "all_jobs", is_flag=True, help="Requeue every failed or cancelled job.")
@json_option
@db_option
def retry_cmd(jobs: tuple[str, ...], suite: str | None, all_jobs: bool, as_json: bool, db_path: Path) -> None:
    """Requeue failed or cancelled jobs (attempt budget renewed); restart running ones."""
    requeued: list[int] = []
    restarting: list[int] = []
    with open_store(db_path) as store:
        for job_id in _select(store, jobs, suite, all_jobs, ("failed", "cancelled")):
            job = get_job(store, job_id)
            if job["state"] in (JobState.FAILED.value, JobState.CANCELLED.value):
                transition(
                    store, job_id, JobState.QUEUED, message="requeued by orch retry", kind="retry",
                    fields={"reason": None, "max_attempts": job["attempt_count"] + max(job["max_attempts"], 1)},
                )
                requeued.append(job_id)
            elif job["state"] == JobState.RUNNING.value and _stop_running(store, job_id, "retry"):
                restarting.append(job_id)
            else:
                raise UsageError(f"job {job_id} is {job['state']}: only failed, cancelled or running jobs can be retried")
    if as_json:
        echo_json({"requeued": requeued, "restarting": restarting})
        return
    click.echo(f"requeued {len(requeued)} job(s); restarting {len(restarting)} running job(s)")


@click.command("resume")
@click.argument("suite")
@db_option
def resume_cmd(suite: str, db_path: Path) -> None:
    """Resume a suite the crash-loop guard paused."""
    with open_store(db_path) as store, store.write():
        cursor = store.db.execute("DELETE FROM paused_suites WHERE suite = ?", [suite])
        if not cursor.rowcount:
            raise UsageError(f"suite {suite!r} is not paused")
        add_event(store, "resume", f"suite {suite} resumed by user")
    click.echo(f"suite {suite} resumed")


@click.command("attach")
@click.argument("job")
@db_option
def attach_cmd(job: str, db_path: Path) -> None:
    """Attach to the tmux window of a job's running attempt (detach with C-b d)."""
    (job_id,) = parse_job_ids((job,))
    with open_store(db_path) as store:
        get_job(store, job_id)
        rows = store.query("SELECT window_id, launcher FROM attempts WHERE job_id = ? ORDER BY n DESC LIMIT 1", [job_id])
    if not rows or not rows[0]["window_id"] or rows[0]["launcher"] != "tmux":
        raise UsageError(f"job {job_id} has no tmux window (not started, or run without tmux): use `orch logs {job_id} -f`")
    tmux = shutil.which("tmux")
    if tmux is None:
        raise UsageError("tmux is not installed")
    socket = tmux_socket_name(db_path)
    os.execv(tmux, [tmux, "-L", socket, "attach-session", "-t", rows[0]["window_id"]])


def register(group: click.Group) -> None:
    for command in (cancel_cmd, retry_cmd, resume_cmd, attach_cmd):
        group.add_command(command)
