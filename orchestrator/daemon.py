"""The scheduler daemon: one per state.db; tick = reconcile -> read GPUs -> pack -> launch."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from orchestrator.daemon_state import (
    DaemonLock,
    runs_dir,
)
from orchestrator.dispatch import DispatchContext, JobShapeCache, schedule
from orchestrator.gpu import GpuProbe
from orchestrator.gpu.attribution import ProcessTrees
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.launch.base import Launcher, kill_process_group
from orchestrator.launch.wrapper import EXIT_FILE
from orchestrator.outcomes import complete
from orchestrator.packing import PackingPolicy
from orchestrator.reconcile import Verdict, disagreement, judge, mark_lost, observe
from orchestrator.store.attempts import live_attempts, update_attempt
from orchestrator.store.db import Store, now_s
from orchestrator.store.jobs import add_event

log = logging.getLogger(__name__)


WAKE_CHECK_S = 0.1  # how often an idle daemon looks for commits by other processes


@dataclass(frozen=True)
class DaemonSettings:
    db_path: Path
    poll_s: float = 1.0
    headroom_fraction: float = 0.10
    headroom_max_mib: int | None = 4096
    starvation_s: float = 600.0
    order: str = "longest_first"  # among equal priorities; "fifo" keeps submission order


class Daemon:
    started_at_s: float | None = None  # attempts claimed before this were claimed by a dead daemon

    def __init__(self, settings: DaemonSettings, probe: GpuProbe, launcher: Launcher, worker_env: dict[str, str]) -> None:
        self.settings = settings
        self.probe = probe
        self.launcher = launcher
        self.store = Store(settings.db_path)
        self.cache = JobShapeCache()
        self.ctx = DispatchContext(
            runs_dir=runs_dir(settings.db_path),
            policy=PackingPolicy(
                headroom_fraction=settings.headroom_fraction, headroom_max_mib=settings.headroom_max_mib,
                starvation_s=settings.starvation_s, order=settings.order,
            ),
            worker_env=worker_env,
        )
        self._stop = threading.Event()
        self._exit_files: list[Path] = []  # exit records that, once written, start a tick early
        self._lock = DaemonLock(settings.db_path)
        self._trees = ProcessTrees()

    # -- lifecycle -------------------------------------------------------------------------

    def request_stop(self, *_: object) -> None:
        self._stop.set()

    def run(self) -> None:
        """Run until asked to stop (SIGTERM/SIGINT or `orch daemon stop`). Workers keep running."""
        os.umask(0o077)  # before anything is created: run dirs, the tmux server, its panes
        self._lock.acquire()
        self.started_at_s = now_s()  # after the lock: no other daemon launches from here on
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            self._register()
            with self.store.write():
                add_event(self.store, "daemon", f"daemon started (pid {os.getpid()}, launcher {self.launcher.name})")
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    if self.tick():
                        break
                except Exception:  # one bad tick must not end a sweep of days
                    log.exception("tick failed; continuing")
                self._idle_until(started + self.settings.poll_s)
        finally:
            with contextlib.suppress(Exception), self.store.write():
                self.store.db.execute("UPDATE daemon SET pid = NULL, heartbeat_at = ?, stop_requested = 0, draining = 0 WHERE id = 1", [now_s()])
                add_event(self.store, "daemon", "daemon stopped; running workers keep running")
            self.probe.close()
            self._lock.release()

    def _idle_until(self, deadline: float) -> None:
        """Wait for the next tick, but start it early when another process committed to
        state.db (a submit, cancel or plan change) or a running attempt wrote its exit record:
        a job that became placeable need not wait a whole poll."""
        seen = self._data_version()
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._stop.wait(min(WAKE_CHECK_S, remaining))
            if self._data_version() != seen or any(path.exists() for path in self._exit_files):
                return

    def _data_version(self) -> int:
        # Changes only when another connection commits; our own heartbeat writes do not count.
        return int(self.store.db.execute("PRAGMA data_version").fetchone()[0])

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop.set()

    def _register(self) -> None:
        create_time = psutil.Process().create_time()
        with self.store.write():
            self.store.db.execute(
                "INSERT INTO daemon (id, pid, proc_create_time, started_at, heartbeat_at, draining, stop_requested) "
                "VALUES (1, ?, ?, ?, ?, 0, 0) ON CONFLICT(id) DO UPDATE SET pid = excluded.pid, "
                "proc_create_time = excluded.proc_create_time, started_at = excluded.started_at, "
                "heartbeat_at = excluded.heartbeat_at, draining = 0, stop_requested = 0",
                [os.getpid(), create_time, now_s(), now_s()],
            )

    # -- one tick --------------------------------------------------------------------------

    def tick(self) -> bool:
        """One pass. Returns True when the daemon should exit (stop requested, or drained)."""
        control = self.store.query("SELECT draining, stop_requested FROM daemon WHERE id = 1")
        draining = bool(control and control[0]["draining"])
        if control and control[0]["stop_requested"]:
            return True
        snapshots = self.probe.snapshot()
        live_before = len(self._exit_files)
        live_count = self.reconcile(snapshots)
        if draining and live_count == 0:
            return True
        if live_count != live_before:  # read again only when an attempt ended (or began) since
            snapshots = self.probe.snapshot()  # after reconcile: memory of attempts that just ended is free
        schedule(self.store, snapshots, self.launcher, self.ctx, self.cache, draining=draining)
        self._heartbeat(snapshots)
        self._exit_files = [
            Path(row["run_dir"]) / EXIT_FILE
            for row in self.store.query("SELECT run_dir FROM attempts WHERE outcome IS NULL")
        ]
        return False

    def reconcile(self, snapshots: tuple[GpuSnapshot, ...]) -> int:
        """Bring every live attempt's record up to date; returns how many are still live."""
        by_uuid = {s.uuid: s for s in snapshots}
        self._trees = ProcessTrees()  # one scan of the host's processes per pass, when needed
        still_live = 0
        for attempt in live_attempts(self.store):
            obs = observe(Path(attempt["run_dir"]), now_s())
            if obs.pid_record is None and obs.exit_record is None and attempt["window_id"] and attempt["launcher"] == self.launcher.name:
                try:
                    obs = replace(obs, window_alive=bool(self.launcher.window_alive(attempt["window_id"])))
                except Exception:  # the launcher could not tell: wait out the grace period
                    log.warning("cannot check window %s of attempt %s", attempt["window_id"], attempt["id"], exc_info=True)
            verdict = judge(attempt, obs, float(attempt["hang_timeout_s"]), self.started_at_s)
            if verdict is Verdict.LOST and obs.pid_record is None and not mark_lost(Path(attempt["run_dir"])):
                verdict = Verdict.PENDING  # its wrapper recorded itself just now: judge it next pass
            if verdict in (Verdict.ALIVE, Verdict.HUNG, Verdict.PENDING):
                self._track(attempt, obs, by_uuid.get(attempt["gpu_uuid"]))
            if verdict is Verdict.ALIVE and attempt["kill_requested"]:
                self._kill(attempt, obs.pid_record)
                still_live += 1
            elif verdict is Verdict.HUNG:
                update_attempt(self.store, attempt["id"], kill_requested="hung")
                with self.store.write():
                    add_event(self.store, "hung", f"attempt {attempt['n']} silent for more than {attempt['hang_timeout_s']:.0f} s: killing it",
                              job_id=attempt["job_id"], attempt_id=attempt["id"])
                self._kill(attempt, obs.pid_record)
                complete(self.store, {**attempt, "kill_requested": "hung"}, observe(Path(attempt["run_dir"]), now_s()), self.cache, hung=True)
            elif verdict is Verdict.FINISHED:
                complete(self.store, attempt, obs, self.cache)
            elif verdict is Verdict.LOST:
                if (why := disagreement(attempt, obs)) is not None:
                    log.warning("attempt %s is not ours: %s; treating it as lost", attempt["id"], why)
                complete(self.store, attempt, obs, self.cache, lost=True)
            else:
                still_live += 1
        return still_live

    def _track(self, attempt: dict[str, Any], obs: Any, gpu: GpuSnapshot | None) -> None:
        fields: dict[str, Any] = {}
        pid_record = obs.pid_record or {}
        if pid_record and attempt["pgid"] is None:
            fields.update(pid=pid_record.get("pid"), pgid=pid_record.get("pgid"), proc_create_time=pid_record.get("create_time"))
        if gpu is not None and obs.process_alive:
            held = gpu.memory_of(self._trees.pids(int(pid_record["pid"])))
            if held != attempt["held_mib"]:
                fields["held_mib"] = held
            if held > attempt["peak_mib"]:
                fields["peak_mib"] = held
            progressed = bool(obs.last_progress and (obs.last_progress.get("step") or 0) >= 1)
            if not attempt["reached_peak"] and (progressed or held >= attempt["predicted_peak_mib"]):
                fields["reached_peak"] = 1
        if obs.last_progress_at and obs.last_progress_at != attempt["last_progress_at"]:
            fields["last_progress_at"] = obs.last_progress_at
            fields["progress_json"] = json.dumps(obs.last_progress) if obs.last_progress else None
        if fields:
            update_attempt(self.store, attempt["id"], **fields)

    def _kill(self, attempt: dict[str, Any], pid_record: dict[str, Any] | None) -> None:
        pgid = (pid_record or {}).get("pgid") or attempt["pgid"]
        if pgid:
            kill_process_group(int(pgid), grace_s=5.0)

    def _heartbeat(self, snapshots: tuple[GpuSnapshot, ...]) -> None:
        with self.store.write():
            self.store.db.execute(
                "UPDATE daemon SET heartbeat_at = ?, gpus_json = ? WHERE id = 1",
                [now_s(), json.dumps([asdict(s) for s in snapshots])],
            )
