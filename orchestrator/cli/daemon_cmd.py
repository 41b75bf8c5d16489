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
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import psutil

from orchestrator.attempts.disk_space import DEFAULT_MIN_FREE_MIB, DEFAULT_WARN_FREE_MIB
from orchestrator.attempts.reconcile import process_matches
from orchestrator.cli.common import db_option, echo_json, fmt_duration, json_option, open_store
from orchestrator.daemon.database_file import daemon_on_lost_file, last_note
from orchestrator.daemon.notify import check_urls
from orchestrator.daemon.state import DaemonLock, daemon_alive, runs_dir, sim_dir, tmux_socket_name
from orchestrator.errors import DaemonError, MissingDatabase, StoreError, UsageError
from orchestrator.executors.runs_tree import check_runs_root
from orchestrator.gpu import GpuProbe, make_probe
from orchestrator.store.control import request_daemon_stop
from orchestrator.store.db import Store, now_s

START_TIMEOUT_S = 30.0


def daemon_log_path(db_path: Path) -> Path:
    return Path(str(Path(db_path).resolve()) + ".daemon.log")


def resolve_backend(db_path: Path, backend: str | None) -> tuple[GpuProbe, dict[str, str]]:
    """The GPU probe and the env the workers need to see the same GPUs."""
    chosen = (backend or os.environ.get("ORCH_GPU_BACKEND") or "").strip().lower() or None
    if chosen == "sim":
        os.environ.setdefault("ORCH_SIM_DIR", str(sim_dir(db_path)))
        Path(os.environ["ORCH_SIM_DIR"]).mkdir(mode=0o700, parents=True, exist_ok=True)
        probe = make_probe("sim", Path(os.environ["ORCH_SIM_DIR"]))
        env = {k: os.environ[k] for k in ("ORCH_SIM_DIR", "ORCH_SIM_GPUS", "ORCH_SIM_HOST") if os.environ.get(k)}
        return probe, {"ORCH_GPU_BACKEND": "sim", **env}
    return make_probe(chosen), {}


@click.group("daemon")
def daemon_group() -> None:
    """Start, stop or inspect the scheduler daemon (one per state.db)."""


def _backend_option(func):  # type: ignore[no-untyped-def]
    return click.option(
        "--backend", type=click.Choice(["nvml", "sim"]), default=None,
        help="GPU backend (env ORCH_GPU_BACKEND; default NVML).",
    )(func)


def _headroom_options(func):  # type: ignore[no-untyped-def]
    func = click.option(
        "--headroom-max-gib", "headroom_max_gib", type=click.FloatRange(0.0, 1024.0), default=4.0, show_default=True,
        help="Cap on the headroom in GiB (10% of a 141 GiB card would be 14 GiB).",
    )(func)
    return click.option(
        "--headroom", "headroom_fraction", type=click.FloatRange(0.0, 0.5), default=0.10, show_default=True,
        help="Fraction of each card kept free beside every job.",
    )(func)


def _order_option(func):  # type: ignore[no-untyped-def]
    return click.option(
        "--order", type=click.Choice(["longest_first", "fifo"]), default="longest_first", show_default=True,
        help="Among equal priorities: longest expected run first (learned from finished jobs), or submission order.",
    )(func)


def _notify_option(func):  # type: ignore[no-untyped-def]
    return click.option(
        "--notify", "notify_urls", multiple=True, envvar="ORCH_NOTIFY", metavar="URL",
        help="Send a one-line summary here when a suite finishes or a job fails (Apprise URL, "
             "e.g. ntfy://TOPIC or slack://...; repeatable; env ORCH_NOTIFY, space-separated; needs orch[notify]).",
    )(func)


def _host_reserve_option(func):  # type: ignore[no-untyped-def]
    return click.option(
        "--host-reserve-gib", "host_reserve_gib", type=click.FloatRange(0.0, 65536.0), default=2.0, show_default=True,
        help="Host RAM kept free of jobs: a job starts only when its predicted host RAM fits in the rest.",
    )(func)


def _disk_options(func):  # type: ignore[no-untyped-def]
    func = click.option(
        "--warn-free-mib", "warn_free_mib", type=click.IntRange(0, 1 << 30), default=DEFAULT_WARN_FREE_MIB,
        show_default=True, help="Warn when the runs dir's filesystem has less free space than this.",
    )(func)
    return click.option(
        "--min-free-mib", "min_free_mib", type=click.IntRange(0, 1 << 30), default=DEFAULT_MIN_FREE_MIB,
        show_default=True, help="Start nothing while the runs dir's filesystem has less free space than this.",
    )(func)


def _poll_option(func):  # type: ignore[no-untyped-def]
    return click.option("--poll", "poll_s", type=click.FloatRange(0.05, 60.0), default=1.0, show_default=True,
                        help="Seconds between scheduling passes.")(func)


_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _executor_options(func: Any) -> Any:
    for option in reversed((
        click.option("--executor", "executor_kind", type=click.Choice(["tmux", "subprocess", "slurm"]), default=None,
                     help="Where attempts run (default: --launcher's choice, tmux when installed)."),
        click.option("--partition", default=None, help="Slurm partition for every attempt (--executor slurm)."),
        click.option("--account", default=None, help="Slurm account to charge (--executor slurm)."),
        click.option("--shard-mib", "shard_mib", type=click.IntRange(1, 10_000_000), default=None,
                     help="MiB one Slurm GPU shard stands for (default: GPU size / shards per GPU)."),
        click.option("--max-in-queue", "max_in_queue", type=click.IntRange(1, 100_000), default=16, show_default=True,
                     help="Attempts kept submitted to Slurm at once (--executor slurm)."),
        click.option("--slurm-poll", "slurm_poll_s", type=click.FloatRange(1.0, 3600.0), default=None,
                     help="Seconds between questions to Slurm about our jobs (default 30; sooner after a submission)."),
        click.option("--exit-grace", "exit_grace_s", type=click.FloatRange(0.0, 3600.0), default=None,
                     help="Seconds a Slurm job out of the queue waits for its exit.json to show on the "
                          "shared filesystem before it is lost (default 60)."),
    )):
        func = option(func)
    return func


def _executor_args(executor_kind: str | None, partition: str | None, account: str | None,
                   shard_mib: int | None, max_in_queue: int, slurm_poll_s: float | None = None,
                   exit_grace_s: float | None = None) -> list[str]:
    """Checked here, in the user's terminal; passed on to `daemon run`."""
    for what, value in (("--partition", partition), ("--account", account)):
        if value is not None and not _SLURM_NAME.fullmatch(value):
            raise UsageError(f"{what} {value!r} is not a Slurm name (letters, digits, '_', '.', '-')")
    if executor_kind != "slurm" and (partition or account or shard_mib or slurm_poll_s is not None or exit_grace_s is not None):
        raise UsageError("--partition, --account, --shard-mib, --slurm-poll and --exit-grace need --executor slurm")
    args = ["--max-in-queue", str(max_in_queue)]
    if executor_kind:
        args += ["--executor", executor_kind]
    named: tuple[tuple[str, str | int | float | None], ...] = (
        ("--partition", partition), ("--account", account), ("--shard-mib", shard_mib),
        ("--slurm-poll", slurm_poll_s), ("--exit-grace", exit_grace_s),
    )
    for flag, given in named:
        if given is not None:
            args += [flag, str(given)]
    return args


def _make_executor(executor_kind: str | None, launcher_kind: str | None, db_path: Path, probe: Any,
                   partition: str | None, account: str | None, shard_mib: int | None, max_in_queue: int,
                   slurm_poll_s: float | None = None, exit_grace_s: float | None = None) -> Any:
    from orchestrator.executors.factory import make_executor
    from orchestrator.executors.slurm.executor import SlurmOptions

    if executor_kind == "slurm":
        gpu_mib = max((s.total_mib for s in probe.snapshot()), default=None)
        options = SlurmOptions(partition, account, shard_mib, max_in_queue)
        if slurm_poll_s is not None:
            options = replace(options, poll_s=slurm_poll_s)
        if exit_grace_s is not None:
            options = replace(options, exit_grace_s=exit_grace_s)
        return make_executor("slurm", tmux_socket_name(db_path), options, gpu_mib)
    return make_executor(executor_kind or launcher_kind, tmux_socket_name(db_path))


@daemon_group.command("run")
@_executor_options
@_backend_option
@_poll_option
@_headroom_options
@click.option("--launcher", "launcher_kind", type=click.Choice(["tmux", "subprocess"]), default=None,
              help="How workers run (env ORCH_LAUNCHER; default tmux when installed).")
@_order_option
@_notify_option
@_host_reserve_option
@_disk_options
@db_option
def daemon_run(
    executor_kind: str | None,
    partition: str | None,
    account: str | None,
    shard_mib: int | None,
    max_in_queue: int,
    slurm_poll_s: float | None,
    exit_grace_s: float | None,
    backend: str | None,
    poll_s: float,
    headroom_fraction: float,
    headroom_max_gib: float,
    launcher_kind: str | None,
    order: str,
    notify_urls: tuple[str, ...],
    host_reserve_gib: float,
    min_free_mib: int,
    warn_free_mib: int,
    db_path: Path,
) -> None:
    """Run the daemon in the foreground."""
    from orchestrator.daemon.loop import Daemon, DaemonSettings
    check_urls(notify_urls)
    # The URLs carry tokens: read once, then gone from the environment before the launcher and
    # its tmux server exist, so no worker inherits them.
    os.environ.pop("ORCH_NOTIFY", None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # libtmux logs every window it creates at INFO; orch logs each launch itself.
    logging.getLogger("libtmux").setLevel(logging.WARNING)
    Store(db_path).close()  # create and migrate before taking the lock
    probe, worker_env = resolve_backend(db_path, backend)
    _executor_args(executor_kind, partition, account, shard_mib, max_in_queue, slurm_poll_s, exit_grace_s)
    launcher = _make_executor(executor_kind, launcher_kind, db_path, probe, partition, account, shard_mib, max_in_queue,
                              slurm_poll_s, exit_grace_s)
    daemon = Daemon(DaemonSettings(
            db_path=db_path, poll_s=poll_s, headroom_fraction=headroom_fraction,
            headroom_max_mib=round(headroom_max_gib * 1024), order=order, notify_urls=tuple(notify_urls),
            max_in_queue=max_in_queue,
            host_reserve_mib=round(host_reserve_gib * 1024),
            min_free_mib=min_free_mib, warn_free_mib=warn_free_mib,
        ), probe, launcher, worker_env)
    click.echo(f"orch daemon: pid {os.getpid()}, {len(probe.snapshot())} GPU(s), launcher {launcher.name}, state {db_path}", err=True)
    daemon.run()


@daemon_group.command("start")
@_executor_options
@_backend_option
@_poll_option
@click.option("--launcher", "launcher_kind", type=click.Choice(["tmux", "subprocess"]), default=None,
              help="How workers run (env ORCH_LAUNCHER; default tmux when installed).")
@_order_option
@_headroom_options
@_notify_option
@_host_reserve_option
@_disk_options
@db_option
def daemon_start(
    executor_kind: str | None,
    partition: str | None,
    account: str | None,
    shard_mib: int | None,
    max_in_queue: int,
    slurm_poll_s: float | None,
    exit_grace_s: float | None,
    backend: str | None,
    poll_s: float,
    launcher_kind: str | None,
    order: str,
    headroom_fraction: float,
    headroom_max_gib: float,
    notify_urls: tuple[str, ...],
    host_reserve_gib: float,
    min_free_mib: int,
    warn_free_mib: int,
    db_path: Path,
) -> None:
    """Start the daemon in the background (log in STATE.db.daemon.log)."""
    check_urls(notify_urls)
    start_daemon(
        db_path, backend=backend, poll_s=poll_s, launcher_kind=launcher_kind, order=order,
        extra_args=["--headroom", str(headroom_fraction), "--headroom-max-gib", str(headroom_max_gib),
                    "--host-reserve-gib", str(host_reserve_gib),
                    "--min-free-mib", str(min_free_mib), "--warn-free-mib", str(warn_free_mib),
                    *_executor_args(executor_kind, partition, account, shard_mib, max_in_queue, slurm_poll_s, exit_grace_s)],
        notify_urls=notify_urls,
    )


def start_daemon(
    db_path: Path,
    *,
    backend: str | None = None,
    poll_s: float = 1.0,
    launcher_kind: str | None = None,
    order: str = "longest_first",
    extra_args: list[str] | None = None,
    quiet: bool = False,
    notify_urls: tuple[str, ...] = (),
) -> int:
    if DaemonLock.is_held(db_path):
        raise DaemonError(f"a daemon is already running for {db_path} (`orch daemon status`)")
    check_runs_root(runs_dir(db_path), create=False)  # a planted or foreign runs dir: say so here
    # Fail here, in the user's terminal, when the GPUs cannot be read.
    probe, _ = resolve_backend(db_path, backend)
    probe.close()
    Store(db_path).close()
    argv = [sys.executable, "-m", "orchestrator", "daemon", "run", "--db", str(db_path), "--poll", str(poll_s),
            "--order", order, *(extra_args or [])]
    if backend:
        argv += ["--backend", backend]
    if launcher_kind:
        argv += ["--launcher", launcher_kind]
    log_path = daemon_log_path(db_path)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as log_file:
        # URLs carry tokens: passed in the environment (owner-only), not on the visible command line.
        env = {**os.environ, "ORCH_NOTIFY": " ".join(notify_urls)} if notify_urls else None
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
