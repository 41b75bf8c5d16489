"""`orch demo`: queue the demo suite, run the daemon, show the sweep live until it is done.

On a machine without an NVIDIA driver it runs on simulated GPUs (real daemon, tmux, SQLite and
worker processes; only the GPU memory is simulated)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

import click
from rich.console import Console, RenderableType
from rich.live import Live

from orchestrator.actions.presence import daemon_alive
from orchestrator.actions.user_actions import cancel_job
from orchestrator.api.daemon_process import daemon_log_path, start_daemon
from orchestrator.api.status_snapshot import status_snapshot
from orchestrator.attempts.reconcile import process_matches
from orchestrator.cli.common import open_store, plans_option
from orchestrator.cli.status.lines import clock, one_line
from orchestrator.cli.status.rich_view import render_status
from orchestrator.daemon.options import DaemonOptions
from orchestrator.errors import OrchError
from orchestrator.gpu.nvml import nvml_available
from orchestrator.lifecycle import JobState
from orchestrator.plans import (
    default_plans_dir,
    expand_jobs,
    load_suite,
    parse_gpu_plan,
    parse_pairs,
)
from orchestrator.store.control import request_daemon_stop
from orchestrator.store.db import Store
from orchestrator.store.jobs import set_gpu_plan, submit_jobs
from orchestrator.store.queries import first_oom_job, job_ids_in_states, state_counts
from orchestrator.store.status import events_after

DEMO_PAIRS = "1:glue_rte 2:glue_rte 3:glue_rte 4:glue_rte"


@click.command("demo")
@click.option(
    "--sim-gpus",
    default="2x24GiB",
    show_default=True,
    help="Simulated GPUs when there is no NVIDIA driver.",
)
@click.option(
    "--gpu-plan",
    "plan_text",
    default="2,1",
    show_default=True,
    help="Per-GPU concurrency caps for the demo.",
)
@click.option(
    "--pairs",
    "pairs_text",
    default=DEMO_PAIRS,
    show_default=True,
    help="SEED:DATA pairs of the demo jobs.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=900.0,
    show_default=True,
    help="Give up (exit 1) when the sweep has not finished after this many seconds.",
)
@plans_option
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="State database to use (default: a fresh one in a new temporary folder, named on screen).",
)
def demo_cmd(
    sim_gpus: str,
    plan_text: str,
    pairs_text: str,
    timeout_s: float,
    plans_dir: Path | None,
    db_path: Path | None,
) -> None:
    """Run the demo sweep end to end with the live dashboard (each run starts fresh)."""
    if not os.environ.get("ORCH_GPU_BACKEND") and not nvml_available():
        os.environ["ORCH_GPU_BACKEND"] = "sim"
        os.environ.setdefault("ORCH_SIM_GPUS", sim_gpus)
        click.echo(f"no NVIDIA driver found: running on simulated GPUs ({os.environ['ORCH_SIM_GPUS']})")
    suite = load_suite("demo", plans_dir or default_plans_dir())
    plan = parse_gpu_plan(plan_text, None)
    specs = expand_jobs(suite, parse_pairs(pairs_text), {}, None, 0)
    console = Console()
    if db_path is None:
        # A second demo must show the sweep again, not "queued 0" over the first one's jobs.
        db_path = Path(tempfile.mkdtemp(prefix="orch-demo-")) / "state.db"
        click.echo(f"demo database: {db_path} (a fresh one each run; --db PATH to choose)")
    with open_store(db_path, create=True) as store:
        outcomes = submit_jobs(store, suite, specs, allowed_gpus=None, priority=0, force=False, dry_run=False)
        set_gpu_plan(store, plan)
        click.echo(f"queued {sum(o.created for o in outcomes)} demo job(s) in {db_path}; GPU plan {plan_text}")
        started_here = False
        if daemon_alive(store) is None:
            pid = start_daemon(DaemonOptions(poll_s=0.5, db_path=db_path))
            click.echo(f"daemon started (pid {pid}); log: {daemon_log_path(db_path)}")
            started_here = True
        deadline = time.monotonic() + timeout_s
        # SIGTERM and SIGHUP (the terminal closed) end the demo as Ctrl-C does: its daemon and
        # workers are stopped on the way out
        previous = {signum: signal.signal(signum, _interrupt)
                    for signum in (signal.SIGTERM, signal.SIGHUP)}
        try:
            if console.is_terminal:
                _watch_live(store, console, deadline)
            else:  # piped or redirected: a line per event as it happens, no frames
                _follow_events(store, deadline)
        except KeyboardInterrupt:
            if started_here:
                _stop_interrupted(store, db_path)
            raise
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        counts = state_counts(store)
        oom_job = first_oom_job(store)
        if started_here:
            _stop_daemon(store, drain=False)
    click.echo(closing_hint(counts, oom_job, db_path))
    if counts["queued"] or counts["running"]:
        raise click.ClickException(f"demo did not finish within {timeout_s:.0f} s (orch status shows why)")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGHUP:
        _leave_closed_terminal()
    raise KeyboardInterrupt


def _leave_closed_terminal() -> None:
    """The terminal is gone: what the demo prints on its way out goes nowhere, instead of an
    error on the first write that would stop it before its daemon is."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            if os.isatty(fd):
                os.dup2(devnull, fd)
        os.close(devnull)


def _stop_daemon(store: Store, *, drain: bool, wait_s: float = 30.0) -> bool:
    """Ask the daemon to stop and wait for its process to go (it takes its tmux server along
    once no attempt is left running): the demo leaves nothing running. True when it went."""
    daemon = daemon_alive(store)
    if daemon is None:
        return True
    request_daemon_stop(store, drain=drain)
    stop_deadline = time.monotonic() + wait_s
    while process_matches(daemon["pid"], daemon["proc_create_time"]):
        if time.monotonic() > stop_deadline:
            return False
        time.sleep(0.1)  # waiting on another process to exit
    return True


def _stop_interrupted(store: Store, db_path: Path) -> None:
    """Ctrl-C or SIGTERM: cancel the demo's jobs (the daemon stops their workers) and let the
    daemon exit once they have ended; when that fails, say how to stop what is left."""
    db_arg = shlex.quote(str(db_path))
    stopped = False
    with contextlib.suppress(KeyboardInterrupt, OrchError):  # a second Ctrl-C: the hint below
        click.echo("demo interrupted: stopping its jobs and its daemon...", err=True)
        for job_id in job_ids_in_states(store, (JobState.QUEUED, JobState.RUNNING), "demo"):
            cancel_job(store, job_id)
        stopped = _stop_daemon(store, drain=True)
    if stopped:
        click.echo("demo stopped: nothing of it is left running", err=True)
    else:
        click.echo(f"the demo's daemon is still running; stop it with: orch daemon stop --db {db_arg} "
                   f"(and its workers with: orch cancel --all --db {db_arg})", err=True)


def _done(store: Store) -> bool:
    counts = state_counts(store)
    return counts["queued"] == 0 and counts["running"] == 0


def _watch_live(store: Store, console: Console, deadline: float) -> None:
    """The live dashboard, sized to the terminal, until the sweep is done or the deadline."""
    def frame() -> RenderableType:
        return render_status(status_snapshot(store, all_jobs=False), width=console.width, height=console.height)

    with Live(frame(), console=console, refresh_per_second=4) as live:
        while time.monotonic() < deadline:
            # done is read before the frame: the last frame shown is never older than the end
            done = _done(store)
            live.update(frame(), refresh=done)
            if done:
                break
            time.sleep(0.5)  # the dashboard's refresh interval
    console.print()


def _follow_events(store: Store, deadline: float) -> None:
    """Each event as one plain line the moment it is read (`12:01:07 job 3: attempt 1 oom on
    GPU 0: ...`), flushed, until the sweep is done or the deadline: a file or a pipe gets the
    sweep as it happens instead of one frame at the end."""
    last_id = 0
    while True:
        done = _done(store)  # read before the events, so that the last ones are printed too
        for event in events_after(store, last_id):
            last_id = event.id
            job = f"job {event.job_id}: " if event.job_id is not None else ""
            click.echo(one_line(f"{clock(event.ts)} {job}{event.message}"))
        sys.stdout.flush()
        if done or time.monotonic() >= deadline:
            return
        time.sleep(0.5)  # the same refresh interval as the dashboard


def closing_hint(counts: dict[str, int], oom_job: int | None, db_path: Path) -> str:
    """What the sweep did and where to look next: `orch show` of the job that ran out of memory
    (its retry down the ladder is the story), else of job 1."""
    db_arg = shlex.quote(str(db_path))
    show = (f"orch show {oom_job} --db {db_arg} (job {oom_job} ran out of memory and was retried)"
            if oom_job is not None else f"orch show 1 --db {db_arg}")
    return (f"demo done: {counts['succeeded']} succeeded, {counts['failed']} failed, {counts['cancelled']} cancelled. "
            f"Try: orch jobs --db {db_arg}, {show}, orch results --db {db_arg}")


def register(group: click.Group) -> None:
    group.add_command(demo_cmd)
