"""`orch daemon start|stop|status|run`."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import psutil

from orchestrator.actions.presence import daemon_alive
from orchestrator.attempts.reconcile import process_matches
from orchestrator.cli.common import db_option, echo_json, json_option, open_store
from orchestrator.cli.daemon.options import NOTIFY_VAR, DaemonOptions
from orchestrator.cli.daemon.setup import check_mps, make_daemon_executor, resolve_backend
from orchestrator.daemon.database_file import daemon_on_lost_file, last_note
from orchestrator.daemon.notify import check_urls
from orchestrator.daemon.state import DaemonLock, runs_dir
from orchestrator.errors import DaemonError, MissingDatabase, StoreError, UsageError
from orchestrator.executors.runs_tree import check_runs_root
from orchestrator.store.control import request_daemon_stop
from orchestrator.store.db import Store, now_s
from orchestrator.wording import fmt_duration

START_TIMEOUT_S = 30.0


def daemon_log_path(db_path: Path) -> Path:
    return Path(str(Path(db_path).resolve()) + ".daemon.log")


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
    start_daemon(options)


def check_no_newline(db_path: Path) -> None:
    """Refuse, before anything is written, a state.db folder or working directory whose path has
    a line break: tmux and its window commands take paths one per line, so every launch from it
    would fail and count against its job."""
    for what, path in (("the state.db folder", Path(db_path).resolve().parent), ("the working directory", Path.cwd())):
        if "\n" in str(path) or "\r" in str(path):
            raise UsageError(f"{what} {str(path)!r} has a line break in its path, which tmux cannot take: "
                             "use a folder without one")


def start_daemon(options: DaemonOptions, quiet: bool = False) -> int:
    """Spawn `orch daemon run` with these options in its own session; its pid once registered."""
    db_path = options.db_path
    if DaemonLock.is_held(db_path):
        raise DaemonError(f"a daemon is already running for {db_path} (`orch daemon status`)")
    check_no_newline(db_path)
    check_runs_root(runs_dir(db_path), create=False)  # a planted or foreign runs dir: say so here
    # Fail here, in the user's terminal, when the GPUs cannot be read.
    probe, _ = resolve_backend(db_path, options.backend)
    probe.close()
    Store(db_path).close()
    argv = [sys.executable, "-m", "orchestrator", "daemon", "run", *options.argv()]
    log_path = daemon_log_path(db_path)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as log_file:
        # URLs carry tokens: passed in the environment (owner-only), not on the visible command line.
        env = {**os.environ, **options.env()} if options.env() else None
        log_offset = os.fstat(fd).st_size  # what this daemon writes starts here
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                                start_new_session=True, close_fds=True, env=env)
    deadline = time.monotonic() + START_TIMEOUT_S
    with open_store(db_path) as store:
        while time.monotonic() < deadline:
            row = daemon_alive(store)
            if row is not None and row["pid"] == proc.pid:
                if not quiet:
                    click.echo(f"daemon started (pid {proc.pid}); log: {log_path}")
                return proc.pid
            if proc.poll() is not None:
                winner = daemon_alive(store)
                if winner is not None or DaemonLock.is_held(db_path):
                    # Lost a race with another `daemon start`: the log's last line is the winner's.
                    shown = f" (pid {winner['pid']})" if winner is not None else ""
                    raise DaemonError(f"another daemon started for {db_path} at the same time and is running{shown}; "
                                      "this one did not start (`orch daemon status`)")
                raise DaemonError(f"daemon exited at start (code {proc.returncode}): {_own_error(log_path, log_offset, proc.pid)}")
            time.sleep(0.1)  # waiting on another process to register
    raise DaemonError(f"daemon did not register within {START_TIMEOUT_S:.0f} s; see {log_path}")


def _own_error(log_path: Path, offset: int, pid: int) -> str:
    """The last line this daemon wrote to the shared log (lines from `offset` on; a line
    naming another daemon's pid is someone else's)."""
    try:
        with open(log_path, "rb") as handle:
            handle.seek(offset)
            lines = handle.read(1 << 20).decode("utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "no output"
    other_pid = re.compile(r"\bpid (\d+)\b")
    for line in reversed(lines):
        match = other_pid.search(line)
        if match is None or int(match.group(1)) == pid:
            return line
    return "no output"


@daemon_group.command("stop")
@click.option("--drain", is_flag=True, help="Start nothing new; exit when the running jobs have ended.")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait for the daemon to exit.")
@click.option("--timeout", "timeout_s", type=float, default=30.0, show_default=True,
              help="Seconds to wait for the daemon to exit (with --wait).")
@db_option
def daemon_stop(drain: bool, wait: bool, timeout_s: float, db_path: Path) -> None:
    """Stop the daemon; running workers keep running (and are adopted at the next start)."""
    lost = daemon_on_lost_file(db_path)
    if lost is not None:  # its database is gone: nothing to write the request into
        _stop_by_signal(lost[0], timeout_s, f"daemon (pid {lost[0]}) stopped; {lost[1].split(';')[0]}")
        return
    note = last_note(db_path) if not Path(db_path).exists() else None
    if note is not None:  # no database since its daemon stopped for that (a live one: above)
        click.echo(f"no daemon is running for {db_path}: nothing to stop (the last one stopped at {note})")
        return
    with open_store(db_path) as store:
        row = daemon_alive(store)
        if row is None:
            # Stopping what is already stopped succeeds, so scripts can always call it.
            click.echo(f"no daemon is running for {db_path}: nothing to stop")
            return
        try:
            request_daemon_stop(store, drain=drain)
        except StoreError as exc:
            if drain:
                raise
            # state.db cannot be written (read-only, immutable, disk full): SIGTERM does the same
            _stop_by_signal(int(row["pid"]), timeout_s, f"daemon stopped (by SIGTERM: {exc})")
            return
        if drain:
            click.echo(f"daemon (pid {row['pid']}) draining: nothing new starts; it exits when running jobs end")
            if not wait:
                return
            timeout_s = max(timeout_s, 10 * 24 * 3600.0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # The process itself must be gone, not only its row cleared: it may still be exiting.
            if not process_matches(row["pid"], row["proc_create_time"]):
                click.echo("daemon stopped")
                return
            time.sleep(0.1)  # waiting on another process to exit
        raise DaemonError(f"daemon (pid {row['pid']}) did not stop within {timeout_s:.0f} s; `kill {row['pid']}` stops it")


EXIT_NOT_RUNNING = 3  # LSB's "program is not running", so `orch daemon status && ...` reads right


def _stop_by_signal(pid: int, timeout_s: float, said: str) -> None:
    """SIGTERM the daemon `pid` (proven ours by the caller) and wait for it to exit."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            click.echo(said)
            return
        time.sleep(0.1)  # waiting on another process to exit
    raise DaemonError(f"daemon (pid {pid}) did not stop within {timeout_s:.0f} s; `kill {pid}` stops it")


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
    )


def register(group: click.Group) -> None:
    group.add_command(daemon_group)
