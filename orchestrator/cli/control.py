"""`orch cancel`, `orch retry`, `orch resume`, `orch attach`: changing what runs."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

import click

from orchestrator.actions.suite_changes import retry_jobs
from orchestrator.actions.user_actions import Done, cancel_job, resume_suite
from orchestrator.cli.common import (
    check_suite_known,
    db_option,
    echo_json,
    json_option,
    open_store,
    parse_job_ids,
    plans_option,
)
from orchestrator.daemon.state import tmux_socket_name
from orchestrator.errors import UsageError
from orchestrator.executors.base import NotAttachable, attach_argv
from orchestrator.lifecycle import JobState
from orchestrator.plans import default_plans_dir
from orchestrator.store.db import Store
from orchestrator.store.queries import get_job, job_ids_in_states, latest_attempt


def _select(
    store: Store, job_args: tuple[str, ...], suite: str | None, all_jobs: bool, states: tuple[JobState, ...],
    db_path: Path,
) -> list[int]:
    if sum(bool(x) for x in (job_args, suite, all_jobs)) != 1:
        raise UsageError("give job ids, --suite S or --all (exactly one of them)")
    if job_args:
        ids = parse_job_ids(job_args)
        for job_id in ids:
            get_job(store, job_id)
        return ids
    if suite:
        check_suite_known(store, suite, db_path)
    return job_ids_in_states(store, states, suite or None)


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
    finished: list[int] = []  # recorded as running, but the worker already succeeded: kept
    skipped: list[dict[str, object]] = []
    with open_store(db_path) as store:
        for job_id in _select(store, jobs, suite, all_jobs, (JobState.QUEUED, JobState.RUNNING), db_path):
            done = cancel_job(store, job_id)
            if done is Done.CANCELLED:
                cancelled.append(job_id)
            elif done is Done.STOPPING:
                stopping.append(job_id)
            elif done is Done.FINISHED:
                finished.append(job_id)
            else:
                skipped.append({"id": job_id, "state": get_job(store, job_id).state.value})
    if as_json:
        echo_json({"cancelled": cancelled, "stopping": stopping, "finished": finished, "skipped": skipped})
        return
    click.echo(f"cancelled {len(cancelled)} queued job(s); stopping {len(stopping)} running job(s)")
    for job_id in finished:
        click.echo(f"  job {job_id} had already finished: its worker succeeded, and its result is kept")
    for item in skipped:
        click.echo(f"  job {item['id']} is {item['state']}: nothing to cancel")


@click.command("retry")
@click.argument("jobs", nargs=-1)
@click.option("--suite", default=None, help="Requeue every failed or cancelled job of a suite.")
@click.option("--all", "all_jobs", is_flag=True, help="Requeue every failed or cancelled job.")
@click.option(
    "--fresh",
    is_flag=True,
    help="Start without a checkpoint: resume from none of the job's attempts so far.",
)
@json_option
@plans_option
@db_option
def retry_cmd(
    jobs: tuple[str, ...],
    suite: str | None,
    all_jobs: bool,
    fresh: bool,
    as_json: bool,
    plans_dir: Path | None,
    db_path: Path,
) -> None:
    """Requeue failed or cancelled jobs (attempt budget renewed); restart running ones. A job
    early stopping pruned is requeued only when named by its id, and resumes from its checkpoint.
    A requeued job takes its suite's worker command as the suite file has it now, and resumes
    from its latest checkpoint where its worker can (--fresh: from none)."""
    with open_store(db_path) as store:
        selected = _select(store, jobs, suite, all_jobs, (JobState.FAILED, JobState.CANCELLED), db_path)
        done = retry_jobs(store, selected, plans_dir or default_plans_dir(), fresh=fresh)
    requeued, restarting, notes = done.requeued, done.restarting, done.notes
    for note in notes:
        click.echo(f"note: {note}", err=True)
    if as_json:
        echo_json({"requeued": requeued, "restarting": restarting})
        return
    click.echo(f"requeued {len(requeued)} job(s); restarting {len(restarting)} running job(s)")


@click.command("resume")
@click.argument("suite")
@db_option
def resume_cmd(suite: str, db_path: Path) -> None:
    """Resume a suite the crash-loop guard paused."""
    with open_store(db_path) as store:
        resume_suite(store, suite)
    click.echo(f"suite {suite} resumed")


@click.command("attach")
@click.argument("job")
@db_option
def attach_cmd(job: str, db_path: Path) -> None:
    """Attach to the tmux window of a job's running attempt (detach with C-b d)."""
    (job_id,) = parse_job_ids((job,))
    with open_store(db_path) as store:
        get_job(store, job_id)
        attempt = latest_attempt(store, job_id)
    if attempt is None:
        raise NotAttachable(
            f"job {job_id} has no tmux window (not started, or run without tmux): use `orch logs {job_id} -f`"
        )
    if not attempt.live:  # its window closed with it: tmux would only say `can't find window`
        outcome = f" ({attempt.outcome.value})" if attempt.outcome else ""
        raise NotAttachable(
            f"job {job_id}'s attempt {attempt.n} has ended{outcome}: its output is in `orch logs {job_id}`"
        )
    argv = attach_argv(attempt, tmux_socket_name(db_path))
    tmux = shutil.which(argv[0])
    if tmux is None:
        raise UsageError("tmux is not installed")
    if not os.isatty(0):  # tmux would say only `open terminal failed: not a terminal`
        raise NotAttachable(f"orch attach needs a terminal, and its input is not one: `orch logs {job_id} -f` "
                            f"follows the job's output; from a terminal: {shlex.join(argv)}")
    os.execv(tmux, [tmux, *argv[1:]])


def register(group: click.Group) -> None:
    for command in (cancel_cmd, retry_cmd, resume_cmd, attach_cmd):
        group.add_command(command)
