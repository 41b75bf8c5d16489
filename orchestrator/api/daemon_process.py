"""The daemon as a background process: started (`orch daemon start`, `Sweep.start_daemon`) and
stopped (`orch daemon stop`, `Sweep.stop_daemon`) by one implementation, which says what it did
in words and raises DaemonError (one line) when it cannot."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from orchestrator.actions.presence import daemon_alive
from orchestrator.attempts.reconcile import process_matches
from orchestrator.daemon.database_file import daemon_on_lost_file, last_note
from orchestrator.daemon.options import DaemonOptions
from orchestrator.daemon.state import DaemonLock, runs_dir, sim_dir
from orchestrator.errors import DaemonError, StoreError, UsageError
from orchestrator.executors.runs_tree import check_runs_root
from orchestrator.gpu import GpuProbe, make_probe
from orchestrator.store.control import request_daemon_stop
from orchestrator.store.db import Store

START_TIMEOUT_S = 30.0


def _open(db_path: Path) -> Store:
    """state.db, refused in one line while a daemon still runs on a removed or replaced one."""
    lost = daemon_on_lost_file(db_path)
    if lost is not None:
        raise StoreError(lost[1])
    return Store(db_path, create=False)


def resolve_backend(db_path: Path, backend: str | None) -> tuple[GpuProbe, dict[str, str]]:
    """The GPU probe and the env the workers need to see the same GPUs."""
    chosen = (backend or os.environ.get("ORCH_GPU_BACKEND") or "").strip().lower() or None
    if chosen == "sim":
        os.environ.setdefault("ORCH_SIM_DIR", str(sim_dir(db_path)))
        try:
            Path(os.environ["ORCH_SIM_DIR"]).mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:  # beside a state.db on a read-only filesystem, say
            folder = os.environ["ORCH_SIM_DIR"]
            raise DaemonError(f"cannot make the simulated GPUs' folder {folder}: "
                              f"{exc.strerror or exc} (ORCH_SIM_DIR names another)") from None
        probe = make_probe("sim", Path(os.environ["ORCH_SIM_DIR"]))
        env = {
            k: os.environ[k]
            for k in ("ORCH_SIM_DIR", "ORCH_SIM_GPUS", "ORCH_SIM_HOST")
            if os.environ.get(k)
        }
        return probe, {"ORCH_GPU_BACKEND": "sim", **env}
    return make_probe(chosen), {}


def daemon_log_path(db_path: Path) -> Path:
    return Path(str(Path(db_path).resolve()) + ".daemon.log")


def check_no_newline(db_path: Path) -> None:
    """Refuse, before anything is written, a state.db folder or working directory whose path has
    a line break: tmux and its window commands take paths one per line, so every launch from it
    would fail and count against its job."""
    for what, path in (
        ("the state.db folder", Path(db_path).resolve().parent),
        ("the working directory", Path.cwd()),
    ):
        if "\n" in str(path) or "\r" in str(path):
            raise UsageError(
                f"{what} {str(path)!r} has a line break in its path, which tmux cannot take: "
                "use a folder without one"
            )


def start_daemon(options: DaemonOptions) -> int:
    """Start `orch daemon run` in the background with these options (log beside the database); its
    pid, once it has registered. DaemonError when one runs already or it exits at start (its
    last line)."""
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
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,
            close_fds=True,
            env=env,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    with _open(db_path) as store:
        while time.monotonic() < deadline:
            row = daemon_alive(store)
            if row is not None and row["pid"] == proc.pid:
                return proc.pid
            if proc.poll() is not None:
                winner = daemon_alive(store)
                if winner is not None or DaemonLock.is_held(db_path):
                    # Lost a race with another `daemon start`: the log's last line is the winner's.
                    shown = f" (pid {winner['pid']})" if winner is not None else ""
                    raise DaemonError(
                        f"another daemon started for {db_path} at the same time and is running{shown}; "
                        "this one did not start (`orch daemon status`)"
                    )
                raise DaemonError(
                    f"daemon exited at start (code {proc.returncode}): {_own_error(log_path, log_offset, proc.pid)}"
                )
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


def stop_daemon(
    db_path: Path, *, drain: bool = False, wait: bool = True, timeout_s: float = 30.0
) -> str:
    """Stop the daemon (`drain`: once its running jobs end); running workers keep running and
    are adopted at the next start. Returns what happened, in words; stopping what is not
    running succeeds, so scripts can always call it."""
    lost = daemon_on_lost_file(db_path)
    if lost is not None:  # its database is gone: nothing to write the request into
        return _stop_by_signal(
            lost[0], timeout_s, f"daemon (pid {lost[0]}) stopped; {lost[1].split(';')[0]}"
        )
    note = last_note(db_path) if not Path(db_path).exists() else None
    if note is not None:  # no database since its daemon stopped for that (a live one: above)
        return (
            f"no daemon is running for {db_path}: nothing to stop (the last one stopped at {note})"
        )
    said: list[str] = []
    with _open(db_path) as store:
        row = daemon_alive(store)
        if row is None:
            return f"no daemon is running for {db_path}: nothing to stop"
        try:
            request_daemon_stop(store, drain=drain)
        except StoreError as exc:
            if drain:
                raise
            # state.db cannot be written (read-only, immutable, disk full): SIGTERM does the same
            return _stop_by_signal(
                int(row["pid"]), timeout_s, f"daemon stopped (by SIGTERM: {exc})"
            )
        if drain:
            said.append(
                f"daemon (pid {row['pid']}) draining: nothing new starts; it exits when running jobs end"
            )
            if not wait:
                return said[0]
            timeout_s = max(timeout_s, 10 * 24 * 3600.0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # The process itself must be gone, not only its row cleared: it may still be exiting.
            if not process_matches(row["pid"], row["proc_create_time"]):
                return "\n".join([*said, "daemon stopped"])
            time.sleep(0.1)  # waiting on another process to exit
        raise DaemonError(
            f"daemon (pid {row['pid']}) did not stop within {timeout_s:.0f} s; `kill {row['pid']}` stops it"
        )


def _stop_by_signal(pid: int, timeout_s: float, said: str) -> str:
    """SIGTERM the daemon `pid` (proven ours by the caller) and wait for it to exit."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return said
        time.sleep(0.1)  # waiting on another process to exit
    raise DaemonError(
        f"daemon (pid {pid}) did not stop within {timeout_s:.0f} s; `kill {pid}` stops it"
    )
