"""The scheduler daemon: one per state.db; tick = reconcile -> read GPUs -> pack -> launch."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from types import FrameType

import psutil

from orchestrator import faults
from orchestrator.attempts.kills import with_memory_held
from orchestrator.attempts.reconcile import (
    process_matches,
)
from orchestrator.attempts.resource_use import ResourceTracker
from orchestrator.clock import SYSTEM_CLOCK, Clock
from orchestrator.daemon.database_file import file_identity, leave_note, what_became_of
from orchestrator.daemon.disk_hold import DiskHold
from orchestrator.daemon.early_stop import EarlyStopper
from orchestrator.daemon.mps_watch import MpsWatch
from orchestrator.daemon.notify import Watcher
from orchestrator.daemon.search import SearchRunner
from orchestrator.daemon.settings import (  # noqa: F401
    MAX_ATTEMPT_ERRORS,
    WAKE_CHECK_S,
    WRAPPER_EXIT_WAIT_S,
    DaemonSettings,
    gpu_topology,
    run_dir_path,
)
from orchestrator.daemon.state import (
    DaemonLock,
    runs_dir,
)
from orchestrator.daemon.watcher import AttemptWatcher
from orchestrator.errors import DaemonError
from orchestrator.executors.base import Executor
from orchestrator.executors.launch_gate import sweep_launch_files
from orchestrator.executors.runs_tree import check_runs_root
from orchestrator.executors.wake import WakeChannel
from orchestrator.gpu import GpuProbe
from orchestrator.gpu.host import make_host_probe
from orchestrator.gpu.sim import SimProbe
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.rundir_files import RunDir
from orchestrator.scheduling.cluster_dispatch import schedule_remote
from orchestrator.scheduling.dispatch import DispatchContext, schedule
from orchestrator.scheduling.packing.types import PackingPolicy
from orchestrator.scheduling.state import SchedulerState
from orchestrator.store.attempts import last_attempt_id
from orchestrator.store.daemon_row import (
    DaemonControl,
    any_live_attempt,
    daemon_control,
    data_version,
    live_host_held_mib,
    live_run_dirs,
    register_daemon,
    unregister_daemon,
    write_heartbeat,
)
from orchestrator.store.db import Store
from orchestrator.store.gpu_samples import GpuReading, record_gpu_samples
from orchestrator.store.jobs import add_event
from orchestrator.store.resources import write_host_reading

log = logging.getLogger(__name__)


class AfterStep(Enum):
    """What a step of the pass says: go on to the next step, or end the pass here (the daemon stops)."""

    GO_ON = "go on"
    EXIT = "exit"  # the daemon stops after this pass


@dataclass
class Pass:
    """What one pass's steps hand each other."""

    only: Collection[Path] | None  # run dirs whose wrappers said they ended; None: every attempt
    live_before: int  # live attempts the last pass left
    control: DaemonControl = field(default_factory=DaemonControl)
    snapshots: tuple[GpuSnapshot, ...] = ()
    live_count: int = 0

    @property
    def attempts_changed(self) -> bool:
        """An attempt ended (or began) since the last pass."""
        return self.live_count != self.live_before


class Daemon:
    """The loop: the lock, the wake channel, and a tick of named steps. What is done for each
    live attempt is the watcher's; what starts next is the scheduler's."""

    def __init__(self, settings: DaemonSettings, probe: GpuProbe, executor: Executor, worker_env: dict[str, str],
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.settings = settings
        self.probe = probe
        self.clock = clock  # where time is policy (hang timeouts, kill grace, holds): tests move it
        self.executor = executor  # tmux, subprocess or Slurm: the daemon never asks which
        self.store = Store(settings.db_path, clock=clock)
        self.scheduler = SchedulerState()  # the scheduler's caches between passes (prediction's in .shapes)
        self.ctx = DispatchContext(
            runs_dir=runs_dir(settings.db_path),
            policy=PackingPolicy(
                headroom_fraction=settings.headroom_fraction, headroom_max_mib=settings.headroom_max_mib,
                starvation_s=settings.starvation_s, order=settings.order, overlap=settings.overlap,
            ),
            worker_env=worker_env,
            host=make_host_probe(), host_reserve_mib=settings.host_reserve_mib,
            topology=gpu_topology(probe),
        )
        self.disk = DiskHold(self.store, clock, self.ctx.runs_dir, settings)
        self.watcher = AttemptWatcher(self.store, clock, executor, self.scheduler, self.ctx.runs_dir,
                                      ResourceTracker(self.ctx.host), self.disk)
        self.notifier = Watcher(self.store, settings.notify_urls)
        self.mps = MpsWatch(self.store)
        self.early_stop = EarlyStopper(self.store)  # suites with `early_stop:`: stops hopeless settings
        self.search = SearchRunner(self.store)  # TPE searches: asks for the next trial as slots free
        self._stop = threading.Event()
        self._hangups = 0  # SIGHUPs received since the last pass said so
        self._exit_files: list[Path] = []  # exit records that, once written, start a tick early
        self._exit_dirs: list[str] = []  # the live run dirs `_exit_files` were made for
        self.wake = WakeChannel(self.ctx.runs_dir)  # wrappers poke it when their attempt ends
        self._lock = DaemonLock(settings.db_path)
        self._db_identity: tuple[int, int] | None = None  # (device, inode) of state.db, read at start

    @property
    def started_at_s(self) -> float | None:
        """When this daemon took the lock (wall time): an adopted attempt's age before it."""
        return self.watcher.started_at_s

    @started_at_s.setter
    def started_at_s(self, value: float | None) -> None:
        self.watcher.started_at_s = value

    # -- lifecycle -------------------------------------------------------------------------

    def run(self) -> None:
        """Run until asked to stop (SIGTERM/SIGINT or `orch daemon stop`). Workers keep running."""
        os.umask(0o077)  # before anything is created: run dirs, the tmux server, its panes
        faults.arm_from_env()  # crash-recovery tests only: exit at a named point
        self._lock.acquire()
        self.started_at_s = self.clock.now_s()  # after the lock: no other daemon launches from here on
        self._db_identity = file_identity(self.settings.db_path)  # the file this daemon runs on
        try:
            self.watcher.adopted_up_to_id = last_attempt_id(self.store)  # those were claimed by an earlier daemon
            check_runs_root(self.ctx.runs_dir, create=True)  # a planted or foreign runs dir: refuse to start
            if swept := sweep_launch_files(self.ctx.runs_dir):
                log.info("removed %d launch file(s) a stopped daemon left in %s", swept, self.ctx.runs_dir)
            self._register()
        except BaseException:
            self._lock.release()
            raise
        if self.settings.mps:  # before any worker starts: each is pointed at it from the first
            try:
                self.ctx = replace(self.ctx, mps=self.mps.start(self.settings.db_path, self.probe.snapshot(),
                                                                  self.clock.now_s(),
                                                                  simulated=isinstance(self.probe, SimProbe)))
            except BaseException:
                with contextlib.suppress(Exception):
                    unregister_daemon(self.store, self.clock.now_s(), "daemon did not start: MPS did not")
                self._lock.release()
                raise
        if not self.wake.open():  # without it, exit records are looked for every WAKE_CHECK_S
            log.warning("cannot open %s: an ended attempt is seen at the next pass", self.wake.path)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_hangup)
        try:
            with self.store.write():
                add_event(self.store, "daemon", f"daemon started (pid {os.getpid()}, launcher {self.executor.name})")
            next_full_s = 0.0
            poked: set[Path] | None = None
            while not self._stop.is_set():
                # A poke (an attempt ended) starts a pass over just those attempts at once;
                # the full pass keeps its period, and is the fallback for a poke never sent.
                if poked is None or time.monotonic() >= next_full_s:
                    poked, next_full_s = None, time.monotonic() + self.settings.poll_s
                try:
                    if self.tick(only=poked):
                        break
                except Exception:  # one bad tick must not end a sweep of days
                    log.exception("tick failed; continuing")
                if self._hangups:  # said here, not in the handler: it may interrupt a log write
                    log.warning("SIGHUP received (the terminal that started the daemon closed?): still running; "
                                "`orch daemon stop` stops it")
                    self._hangups = 0
                poked = self._idle_until(next_full_s)
        finally:
            with contextlib.suppress(Exception):
                unregister_daemon(self.store, self.clock.now_s(), "daemon stopped; running workers keep running")
            self._close_idle_executor()
            self.mps.stop()
            self.wake.close()
            self.watcher.observed.close()
            with contextlib.suppress(Exception):
                self.notifier.poll()  # what ended in the last pass
                self.notifier.close()
            self.probe.close()
            self._lock.release()

    def _close_idle_executor(self) -> None:
        """Nothing orch started for itself outlives it: with no attempt left running, the
        executor's own server (tmux) goes too. Workers still running keep it, to be adopted."""
        with contextlib.suppress(Exception):
            if any_live_attempt(self.store):
                return
            self.executor.close()

    def _idle_until(self, deadline: float) -> set[Path] | None:
        """Wait for the next tick, but start it early when another process committed to
        state.db (a submit, cancel or plan change) or a running attempt ended: a job that
        became placeable need not wait a whole poll. Returns the run dirs of attempts whose
        wrappers poked the wake FIFO (a pass over just those), or None (a full pass)."""
        seen = self._data_version()
        poll_exit_files = not self.wake.active  # the FIFO says it at once; else look every 0.1 s
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            poked = self.wake.wait(min(WAKE_CHECK_S, remaining))
            if poked:
                return poked
            if self._data_version() != seen or (poll_exit_files and any(path.exists() for path in self._exit_files)):
                return None
        return None

    def _data_version(self) -> int:
        # Changes only when another connection commits; our own heartbeat writes do not count.
        return data_version(self.store)

    def _database_lost(self) -> bool:
        """state.db removed or replaced under us (device and inode, read every pass): stop,
        saying why in the log and the lock file; running workers keep running."""
        why = what_became_of(self.settings.db_path, self._db_identity) if self._db_identity is not None else None
        if why is None:
            return False
        log.error("%s: stopping; running workers keep running (a daemon on a new database adopts none of them)", why)
        fd = self._lock.fileno()
        if fd is not None:
            leave_note(fd, why)
        return True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.request_stop()

    def _on_hangup(self, signum: int, frame: FrameType | None) -> None:
        self._hangups += 1

    def request_stop(self) -> None:
        """End the loop after the current pass (a signal, or a caller running it in a thread)."""
        self._stop.set()

    def _register(self) -> None:
        """Record this daemon in state.db, unless another live daemon is recorded there: a second
        guard beside the lock file, for the same state.db reached through a hard link."""
        def refuse_live(pid: int | None, proc_create_time: float | None) -> None:
            if pid and pid != os.getpid() and process_matches(pid, proc_create_time):
                raise DaemonError(
                    f"a daemon is already running for this state.db (pid {pid}); "
                    "`orch daemon status` shows it, `orch daemon stop` stops it"
                )

        modes = [name for name, on in (("overlap", self.settings.overlap), ("mps", self.settings.mps)) if on]
        register_daemon(self.store, os.getpid(), psutil.Process().create_time(), self.clock.now_s(), refuse_live,
                        modes)

    # -- one tick --------------------------------------------------------------------------

    def tick(self, only: Collection[Path] | None = None) -> bool:
        """One pass: each of `steps` in turn, until one ends it. Returns True when the daemon
        should exit (the database lost, a stop requested, or drained). `only`: run dirs whose
        wrappers said they ended; just those attempts are reconciled."""
        this_pass = Pass(only=only, live_before=len(self._exit_files))
        return any(step(this_pass) is AfterStep.EXIT for step in self.steps)  # stops at the first EXIT

    @property
    def steps(self) -> tuple[Callable[[Pass], AfterStep], ...]:
        return (self._check_database, self._read_control, self._check_disk, self._read_gpus, self._reconcile,
                self._stop_early, self._ask_trials, self._check_mps, self._end_when_drained, self._read_gpus_again,
                self._schedule_pass, self._record_pass, self._watch_exit_files)

    def _check_database(self, this_pass: Pass) -> AfterStep:
        return AfterStep.EXIT if self._database_lost() else AfterStep.GO_ON

    def _read_control(self, this_pass: Pass) -> AfterStep:
        this_pass.control = daemon_control(self.store)
        return AfterStep.EXIT if this_pass.control.stop_requested else AfterStep.GO_ON

    def _check_disk(self, this_pass: Pass) -> AfterStep:
        self.disk.check()
        return AfterStep.GO_ON

    def _read_gpus(self, this_pass: Pass) -> AfterStep:
        this_pass.snapshots = self.probe.snapshot()
        return AfterStep.GO_ON

    def _reconcile(self, this_pass: Pass) -> AfterStep:
        this_pass.live_count = self.watcher.reconcile(this_pass.snapshots, this_pass.only)
        return AfterStep.GO_ON

    def _stop_early(self, this_pass: Pass) -> AfterStep:
        self.early_stop.check()  # after reconcile: the histories it read are in the store
        return AfterStep.GO_ON

    def _ask_trials(self, this_pass: Pass) -> AfterStep:
        self.search.check()  # before scheduling: a trial asked now can start in this pass
        return AfterStep.GO_ON

    def _check_mps(self, this_pass: Pass) -> AfterStep:
        self.mps.check(self.clock.now_s(), {s.uuid: s.index for s in this_pass.snapshots})
        return AfterStep.GO_ON

    def _end_when_drained(self, this_pass: Pass) -> AfterStep:
        if this_pass.control.draining and this_pass.live_count == 0:
            self.watcher.close_ended()
            return AfterStep.EXIT
        return AfterStep.GO_ON

    def _read_gpus_again(self, this_pass: Pass) -> AfterStep:
        if this_pass.attempts_changed:  # after reconcile: memory of attempts that just ended is free
            this_pass.snapshots = self.probe.snapshot()
        return AfterStep.GO_ON

    def _schedule_pass(self, this_pass: Pass) -> AfterStep:
        self._schedule(this_pass.snapshots, this_pass.control.draining)
        return AfterStep.GO_ON

    def _schedule(self, snapshots: tuple[GpuSnapshot, ...], draining: bool) -> None:
        """Pack the queue and start what fits (a cluster: keep its queue topped up), then close
        what the executor kept open for the attempts that ended this pass."""
        hold = self.disk.hold_reason()
        try:
            if self.executor.remote:
                schedule_remote(self.store, self.executor, self.ctx, self.scheduler.shapes, draining=draining,
                                max_in_queue=self.settings.max_in_queue, hold=hold)
            else:
                schedule(
                    self.store,
                    with_memory_held(snapshots, self.watcher.ending_mib),
                    self.executor,
                    self.ctx,
                    self.scheduler,
                    draining=draining,
                    hold=hold,
                    run_age_s=self.watcher.run_age_s,
                )
        finally:  # the next workers start first: closing a dead window costs tmux calls
            self.watcher.close_ended()

    def _record_pass(self, this_pass: Pass) -> AfterStep:
        """Notifications, the heartbeat (GPUs, host, disk) and the memory history of the pass."""
        snapshots = this_pass.snapshots
        self.notifier.poll()
        self._heartbeat(snapshots)
        record_gpu_samples(  # the memory history the web page and the report draw
            self.store,
            [GpuReading(s.index, s.uuid, s.total_mib, s.used_mib, s.free_mib) for s in snapshots],
            self.clock.now_s(),
        )
        return AfterStep.GO_ON

    def _watch_exit_files(self, this_pass: Pass) -> AfterStep:
        """The exit records that, once written, start the next pass early (no wake FIFO)."""
        if this_pass.only is not None and not this_pass.attempts_changed:
            return AfterStep.GO_ON
        run_dirs = live_run_dirs(self.store)
        if run_dirs != self._exit_dirs:  # the same attempts: the same paths, not made again
            self._exit_dirs, self._exit_files = run_dirs, [RunDir(run_dir).exit for run_dir in run_dirs]
        return AfterStep.GO_ON

    def _heartbeat(self, snapshots: tuple[GpuSnapshot, ...]) -> None:
        if self.ctx.host is not None:
            reading = self.ctx.host.snapshot()
            ours = live_host_held_mib(self.store)
            write_host_reading(self.store, {
                "total_mib": reading.total_mib, "available_mib": reading.available_mib, "ours_mib": ours,
                "reserve_mib": self.ctx.host_reserve_mib, "cpus": reading.cpus,
            })
        write_heartbeat(self.store, self.clock.now_s(), [s.to_json() for s in snapshots],
                        self.disk.state.to_json() if self.disk.state is not None else None)
