"""`orch daemon start|stop|status|run`."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import click

from orchestrator.actions.presence import daemon_alive
from orchestrator.api.daemon_process import (
    check_no_newline,
    daemon_log_path,
    start_daemon,
    stop_daemon,
)
from orchestrator.cli.common import db_option, echo_json, json_option, open_store
from orchestrator.cli.daemon.setup import check_mps, make_daemon_executor, resolve_backend
from orchestrator.daemon.database_file import daemon_on_lost_file, last_note
from orchestrator.daemon.options import NOTIFY_VAR, DaemonOptions
from orchestrator.errors import MissingDatabase
from orchestrator.plans.notify_urls import check_urls
from orchestrator.store.db import Store, now_s
from orchestrator.wording import fmt_duration


@click.group("daemon")
def daemon_group() -> None:
    """Start, stop or inspect the scheduler daemon (one per state.db)."""


@daemon_group.command("run")
@DaemonOptions.click_options
def daemon_run(**given: Any) -> None:
    """Run the daemon in the foreground."""
    from orchestrator.daemon.loop import Daemon

    options = DaemonOptions(**given)
    check_urls(options.notify_urls)
    check_mps(options.mps, options.backend)
    # The URLs carry tokens: read once, then gone from the environment before the launcher and
    # its tmux server exist, so no worker inherits them.
    os.environ.pop(NOTIFY_VAR, None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # libtmux logs every window it creates at INFO; orch logs each launch itself.
    logging.getLogger("libtmux").setLevel(logging.WARNING)
    db_path = options.db_path
    check_no_newline(db_path)
    options.check_executor()
    Store(db_path).close()  # create and migrate before taking the lock
    probe, worker_env = resolve_backend(db_path, options.backend)
    launcher = make_daemon_executor(options, probe)
    daemon = Daemon(options.settings(), probe, launcher, worker_env)
    click.echo(f"orch daemon: pid {os.getpid()}, {len(probe.snapshot())} GPU(s), launcher {launcher.name}, "
               f"state {db_path}", err=True)
    daemon.run()


@daemon_group.command("start")
@DaemonOptions.click_options
def daemon_start(**given: Any) -> None:
    """Start the daemon in the background (log in STATE.db.daemon.log)."""
    options = DaemonOptions(**given)
    check_urls(options.notify_urls)
    check_mps(options.mps, options.backend)
    options.check_executor()
    pid = start_daemon(options)
    click.echo(f"daemon started (pid {pid}); log: {daemon_log_path(options.db_path)}")


@daemon_group.command("stop")
@click.option("--drain", is_flag=True, help="Start nothing new; exit when the running jobs have ended.")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait for the daemon to exit.")
@click.option("--timeout", "timeout_s", type=float, default=30.0, show_default=True,
              help="Seconds to wait for the daemon to exit (with --wait).")
@db_option
def daemon_stop(drain: bool, wait: bool, timeout_s: float, db_path: Path) -> None:
    """Stop the daemon; running workers keep running (and are adopted at the next start)."""
    click.echo(stop_daemon(db_path, drain=drain, wait=wait, timeout_s=timeout_s))


EXIT_NOT_RUNNING = 3  # LSB's "program is not running", so `orch daemon status && ...` reads right


@daemon_group.command("status")
@json_option
@db_option
def daemon_status(as_json: bool, db_path: Path) -> None:
    """Is a daemon running for this state.db? Exits 3 when none is (as `systemctl status` does);
    --json exits 0 either way and says it in `alive`."""
    lost = daemon_on_lost_file(db_path)
    if lost is not None and not as_json:
        click.echo(f"daemon: {lost[1]}")  # still running, on a database file that is gone
        return
    try:
        with open_store(db_path) as store:  # a read: never creates a database
            row = daemon_alive(store)
    except MissingDatabase:
        note = last_note(db_path)
        if note is None or as_json:
            raise
        click.echo(f"daemon: not running for {db_path}; the last one stopped at {note}")
        raise click.exceptions.Exit(EXIT_NOT_RUNNING) from None
    payload = {
        "alive": row is not None,
        "pid": row["pid"] if row else None,
        "started_at": row["started_at"] if row else None,
        "heartbeat_age_s": (now_s() - row["heartbeat_at"]) if row and row["heartbeat_at"] else None,
        "draining": bool(row["draining"]) if row else False,
        "modes": row["modes"] if row else [],  # opt-in ways it runs: overlap, mps
        "log": str(daemon_log_path(db_path)),
    }
    if as_json:
        echo_json(payload)
        return
    if row is None:
        click.echo(f"daemon: not running for {db_path} (orch daemon start)")
        raise click.exceptions.Exit(EXIT_NOT_RUNNING)
    click.echo(
        f"daemon: running, pid {row['pid']}, up {fmt_duration(now_s() - row['started_at'])}, "
        f"last tick {payload['heartbeat_age_s']:.1f} s ago" + (", draining" if payload["draining"] else "")
        + "".join(f", --{mode}" for mode in payload["modes"])
    )


def register(group: click.Group) -> None:
    group.add_command(daemon_group)
