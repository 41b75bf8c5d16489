"""End-to-end harness: a real daemon started through the CLI, real tmux on a private socket,
real SQLite, simulated GPUs. Every wait is a poll with a deadline."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
import yaml

from orchestrator.attempts.containment import remove_empty_cgroups
from orchestrator.attempts.reconcile import process_matches
from orchestrator.daemon.state import runs_dir, tmux_socket_name
from orchestrator.lifecycle import JobState
from orchestrator.store import Store
from orchestrator.store.daemon_row import read_daemon
from orchestrator.store.queries import get_attempts
from orchestrator.store.rows import Attempt, Job
from orchestrator.store.status import Event
from orchestrator.store.sweep_attempts import all_attempts
from tests.store_reads import events, live_attempts, read_jobs

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.05
CLI_TIMEOUT_S = 60.0


def wait_until(
    condition: Callable[[], T | None], deadline_s: float = 15.0, what: str = "the condition", poll_s: float = POLL_S
) -> T:
    """Poll `condition` until it returns something truthy; fail the test after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}")
        time.sleep(poll_s)  # polling a condition, not waiting blindly


class Orch:
    """One isolated orch installation in a temp dir: state.db, plans dir, sim GPUs, tmux socket."""

    def __init__(self, root: Path, gpus: str = "2x24GiB", foreign: str | None = None) -> None:
        self.root = root
        self.db = root / "state.db"
        self.plans = root / "plans"
        (self.plans / "suites").mkdir(parents=True)
        self.socket = tmux_socket_name(self.db)
        self.env = {
            **os.environ,
            "ORCH_DB": str(self.db),
            "ORCH_PLANS": str(self.plans),
            "ORCH_GPU_BACKEND": "sim",
            "ORCH_SIM_GPUS": gpus,
            "ORCH_SIM_DIR": str(root / "sim"),
            "ORCH_LAUNCHER": "tmux",
            # this checkout's orch, whatever `pip install -e` points the interpreter at
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.env.pop("ORCH_SIM_FOREIGN", None)
        if foreign:
            self.env["ORCH_SIM_FOREIGN"] = foreign
        self.daemon_started: dict[int, float] = {}  # pid -> its start time: pids get reused

    # -- plans --------------------------------------------------------------------------------

    def write_suite(self, name: str, configs: dict[str, dict[str, Any]], **suite: Any) -> None:
        """A suite NAME whose configs are the given mappings (sim worker unless `worker=`)."""
        config_dir = self.plans / "configs" / name
        config_dir.mkdir(parents=True, exist_ok=True)
        for config_name, content in configs.items():
            base = {"model": "tiny-llama", "batch_size": 4, "gradient_accumulation_steps": 1,
                    "gradient_checkpointing": False, "num_data_workers": 2,
                    "sim_seconds": 2, "sim_ramp_s": 0.5}
            (config_dir / f"{config_name}.yaml").write_text(yaml.safe_dump({**base, **content}))
        body = {"worker": "sim", "mem_gib": 8, "max_attempts": 6, "hang_timeout_s": 60,
                **suite, "configs": list(configs)}
        (self.plans / "suites" / f"{name}.yaml").write_text(yaml.safe_dump(body))

    # -- CLI ----------------------------------------------------------------------------------

    def run(self, *args: str, check: bool = True, timeout_s: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "orchestrator", *args], env=self.env, cwd=self.root,
            capture_output=True, text=True, timeout=timeout_s,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"orch {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *args], env=self.env, cwd=self.root,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--json").stdout)

    def submit(self, suite: str, pairs: str, *extra: str) -> None:
        self.run("submit", "--suite", suite, "--pairs", pairs, *extra)

    def start_daemon(self, poll_s: float = 0.2) -> int:
        started = self.run("daemon", "start", "--poll", str(poll_s)).stdout
        said = re.search(r"daemon started \(pid (\d+)\)", started)  # saves a `daemon status` call
        pid = int(said.group(1)) if said else int(self.json("daemon", "status")["pid"])
        self.remember_daemon(pid)
        return pid

    def start_daemon_dying_at(self, point: str) -> None:
        """Start a daemon that exits at fault point `point`; return once it has and is gone.
        `daemon start` may see it registered, or (on a busy machine, its look coming after the
        fault) see it exit at start naming the fault point: both are this test's daemon."""
        self.env["ORCH_FAULT_POINT"] = point
        try:
            started = self.run("daemon", "start", "--poll", "0.2", check=False)
        finally:
            del self.env["ORCH_FAULT_POINT"]
        said = re.search(r"daemon started \(pid (\d+)\)", started.stdout)
        if said:
            self.remember_daemon(int(said.group(1)))
        else:
            assert f"fault point {point} reached" in started.stderr, started.stdout + started.stderr
        log = Path(str(self.db) + ".daemon.log")
        wait_until(lambda: f"fault point {point} reached" in log.read_text(errors="replace") or None, 60,
                   f"the daemon to stop at fault point {point}")
        wait_until(lambda: self.daemon_pid() is None or None, 30, "the daemon to be gone")

    def remember_daemon(self, pid: int) -> None:
        """A daemon this test started, stopped at teardown while it is still that process."""
        if pid <= 0:
            return
        with contextlib.suppress(psutil.Error, ValueError):
            self.daemon_started.setdefault(pid, psutil.Process(pid).create_time())

    def daemon_pid(self) -> int | None:
        pid = self.json("daemon", "status")["pid"]
        return int(pid) if pid else None

    def stop_daemon(self) -> None:
        if self.daemon_pid() is not None:
            self.run("daemon", "stop", "--timeout", "30")

    # -- state, read back through the store's own readers (cheap enough to sample every few ms) --

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Rows of `sql`, read-only (only `attempts()` still reads columns this way)."""
        if not self.db.exists():
            return []
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10.0)
        try:
            conn.row_factory = sqlite3.Row
            return [dict(r) for r in conn.execute(sql, params).fetchall()]
        finally:
            conn.close()

    def read(self, reader: Callable[[Store], T]) -> T:
        """`reader` over the state.db through the store's own functions (the db must exist)."""
        with Store(self.db, create=False) as store:
            return reader(store)

    def jobs(self, *states: JobState, suite: str | None = None) -> list[Job]:
        """The jobs in one of `states` (every job when none is given), by id; none before a submit."""
        return self.read(lambda store: read_jobs(store, *states, suite=suite)) if self.db.exists() else []

    def job_states(self) -> dict[int, str]:
        return {job.id: job.state.value for job in self.jobs()}

    def all_done(self) -> bool:
        states = self.job_states()
        return bool(states) and all(s in ("succeeded", "failed", "cancelled", "pruned") for s in states.values())

    def wait_all_done(self, deadline_s: float) -> dict[int, str]:
        wait_until(self.all_done, deadline_s, "every job to end")
        return self.job_states()

    def attempts(self, job_id: int | None = None) -> list[dict[str, Any]]:
        """Every attempt by id, or one job's by n, as column dicts; `attempt_rows` gives typed rows."""
        if job_id is None:
            return self._rows("SELECT * FROM attempts ORDER BY id")
        return self._rows("SELECT * FROM attempts WHERE job_id = ? ORDER BY n", (job_id,))

    def attempt_rows(self, job_id: int | None = None) -> list[Attempt]:
        """Every attempt by id, or one job's by n; none before a submit."""
        if not self.db.exists():
            return []
        return self.read(all_attempts if job_id is None else lambda store: get_attempts(store, job_id))

    def live_attempts(self) -> list[Attempt]:
        """The attempts without an outcome yet, by id."""
        return self.read(live_attempts) if self.db.exists() else []

    def events(self, kind: str | None = None) -> list[Event]:
        """Every event (of one kind), oldest first."""
        return self.read(lambda store: events(store, kind)) if self.db.exists() else []

    # -- teardown -----------------------------------------------------------------------------

    def kill_leftover_groups(self) -> None:
        """SIGKILL what this test's attempts left running. Only a group one of whose members still
        names this test's folder is killed: a pgid recorded minutes ago may by now be another
        test's process (pids wrap at 32768 over a full run), its tmux server for one."""
        own_group = os.getpgid(0)
        for pgid in self.attempt_pgids():
            if pgid > 1 and pgid != own_group and group_is_under(pgid, self.root):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)

    def attempt_pgids(self) -> set[int]:
        pgids = {a.pgid for a in self.attempt_rows() if a.pgid is not None}
        for pid_file in (self.root / "runs").rglob("pid.json") if (self.root / "runs").exists() else []:
            if pid_file.is_symlink() or not pid_file.is_file():
                continue  # a hostile worker's FIFO or link: reading it could block or leave the tree
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                pgids.add(int(json.loads(pid_file.read_text())["pgid"]))
        return pgids

    def _live_daemons(self) -> set[int]:
        """Daemons this test started, and the one state.db names while it is that very process."""
        live = {pid for pid, created in self.daemon_started.items() if process_matches(pid, created)}
        with contextlib.suppress(Exception):
            row = self.read(read_daemon)
            if row is not None and row.pid is not None and process_matches(row.pid, row.proc_create_time):
                live.add(row.pid)
        return live

    def cleanup(self) -> None:
        # SIGTERM is what `orch daemon stop` leads to, without two CLI starts per test
        daemons = self._live_daemons()
        for pid in daemons:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not any(pid_alive(pid) for pid in daemons), 30, "the daemons to stop")
        for pid in daemons:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, check=False)
        self.kill_leftover_groups()
        runs = self.root / "runs"
        # the attempts' cgroup folders, where any were made, once the processes killed above are gone
        with contextlib.suppress(AssertionError):
            wait_until(lambda: remove_empty_cgroups(runs_dir(self.db)) == 0, 5, "the attempts' cgroups to empty")
        if runs.exists():
            runs.chmod(0o700)


def group_alive(pgid: int) -> bool:
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError, psutil.AccessDenied):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def group_is_under(pgid: int, root: Path) -> bool:
    """Whether a live member of group `pgid` names `root` in its command line, working folder
    or environment (workers and wrappers get their run dir in all three)."""
    folder = str(Path(root).resolve())
    inside = folder + os.sep
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) != pgid or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cwd = proc.cwd()
            if cwd == folder or cwd.startswith(inside) or any(inside in arg for arg in proc.cmdline()):
                return True
            if any(value == folder or inside in value for value in proc.environ().values()):
                return True
    return False


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextlib.contextmanager
def orch_env(tmp_path: Path, **kwargs: Any) -> Iterator[Orch]:
    orch = Orch(tmp_path, **kwargs)
    try:
        yield orch
    finally:
        orch.cleanup()


requires_tmux = pytest.mark.skipif(
    subprocess.run(["which", "tmux"], capture_output=True, check=False).returncode != 0,
    reason="needs the tmux binary",
)
