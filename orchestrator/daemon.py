"""The scheduler daemon: one per state.db; tick = reconcile -> read GPUs -> pack -> launch."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from orchestrator.clock import SYSTEM_CLOCK, Clock
from orchestrator.daemon_state import (
    DaemonLock,
    runs_dir,
)
from orchestrator.diskspace import (
    DEFAULT_MIN_FREE_MIB,
    DEFAULT_WARN_FREE_MIB,
    DiskState,
    disk_state,
)
from orchestrator.dispatch import DispatchContext, schedule
from orchestrator.dispatch_remote import schedule_remote
from orchestrator.errors import DaemonError, OrchError
from orchestrator.executors import Executor, LocalExecutor, RemoteStatus
from orchestrator.executors.remote_verdict import remote_end, remote_observation
from orchestrator.executors.slurm import SlurmExecutor
from orchestrator.gpu import GpuProbe
from orchestrator.gpu.attribution import ProcessTrees
from orchestrator.gpu.host import make_host_probe
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.kills import GroupStopper, ending_peaks_mib, with_memory_held
from orchestrator.launch.base import Launcher
from orchestrator.launch.runtree import check_runs_root
from orchestrator.launch.wrapper import EXIT_FILE
from orchestrator.notify import Watcher
from orchestrator.outcomes import abandon, complete, learn_rate
from orchestrator.packing import PackingPolicy
from orchestrator.prediction import JobShapeCache, attempt_shape_key, job_worker_output
from orchestrator.reconcile import (
    Observation,
    Verdict,
    disagreement,
    judge,
    mark_lost,
    observe,
    process_matches,
    proven_group,
)
from orchestrator.stdout_follow import OutputFollower, follows_stdout
from orchestrator.store.attempts import live_attempts, update_attempt
from orchestrator.store.db import Store
from orchestrator.store.gpu_samples import GpuReading, record_gpu_samples
from orchestrator.store.jobs import add_event
from orchestrator.store.resources import learn_host_shape, write_host_reading
from orchestrator.track_resources import ResourceTracker

log = logging.getLogger(__name__)


MAX_ATTEMPT_ERRORS = 5  # passes in a row that fail on one attempt before it is closed as failed
WAKE_CHECK_S = 0.1  # how often an idle daemon looks for commits by other processes


@dataclass(frozen=True)
class DaemonSettings:
    db_path: Path
    poll_s: float = 1.0
    headroom_fraction: float = 0.10
    headroom_max_mib: int | None = 4096
    starvation_s: float = 600.0
    order: str = "longest_first"  # among equal priorities; "fifo" keeps submission order
    notify_urls: tuple[str, ...] = ()  # sent a line when a suite finishes or a job fails
    max_in_queue: int = 16  # a remote executor (Slurm): attempts kept submitted at once
    min_free_mib: int = DEFAULT_MIN_FREE_MIB  # below this on the runs dir's filesystem, jobs wait
    warn_free_mib: int = DEFAULT_WARN_FREE_MIB  # below this, the daemon warns
    host_reserve_mib: int = 2048  # host RAM no job may take (--host-reserve-gib)


def _topology(probe: GpuProbe) -> dict[tuple[int, int], int] | None:
    """Card distances where the probe can tell (NVML, simulated pairs); None elsewhere."""
    read = getattr(probe, "topology", None)
    if read is None:
        return None
    try:
        return dict(read())
    except Exception:  # topology only orders equally good choices: never stop the daemon for it
        log.warning("cannot read the GPU topology", exc_info=True)
        return None


class Daemon:
    started_at_s: float | None = None  # attempts claimed before this were claimed by a dead daemon

    def __init__(self, settings: DaemonSettings, probe: GpuProbe, launcher: Launcher | Executor, worker_env: dict[str, str],
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.settings = settings
        self.probe = probe
        self.clock = clock  # where time is policy (hang timeouts, kill grace, holds): tests move it
        # the executor seam; a bare launcher (tmux, subprocess) is wrapped as a local executor
        self.launcher: Executor = launcher if isinstance(launcher, (LocalExecutor, SlurmExecutor)) else LocalExecutor(launcher)
        self.store = Store(settings.db_path, clock=clock)
        self.cache = JobShapeCache()
        self.ctx = DispatchContext(
            runs_dir=runs_dir(settings.db_path),
            policy=PackingPolicy(
                headroom_fraction=settings.headroom_fraction, headroom_max_mib=settings.headroom_max_mib,
                starvation_s=settings.starvation_s, order=settings.order,
            ),
            worker_env=worker_env,
            host=make_host_probe(), host_reserve_mib=settings.host_reserve_mib,
            topology=_topology(probe),
        )
        self.resources = ResourceTracker(self.ctx.host)
        self._by_uuid: dict[str, GpuSnapshot] = {}  # this pass's cards, for a gang's other ranks
        self.notifier = Watcher(self.store, settings.notify_urls)
        self._stop = threading.Event()
        self._exit_files: list[Path] = []  # exit records that, once written, start a tick early
        self._lock = DaemonLock(settings.db_path)
        self.output = OutputFollower()  # progress of workers that write no progress.jsonl
        self._rates: dict[int, tuple[int, float, int]] = {}  # attempt -> last (step, time, tenants)
        self.disk: DiskState | None = None
        self._attempt_errors: dict[int, str] = {}  # last error recorded per attempt, so it is not repeated
        self._attempt_error_counts: dict[int, int] = {}  # passes in a row that failed on the attempt
        self._trees = ProcessTrees()
        self._cancel_sent: set[int] = set()  # remote attempts whose cancel reached the backend
        self.stopper = GroupStopper(clock)  # local groups being stopped, across passes
        self._ending_mib: Counter[str] = Counter()  # per card: ended attempts whose group is not gone yet

    # -- lifecycle -------------------------------------------------------------------------

    def request_stop(self, *_: object) -> None:
        self._stop.set()

    def run(self) -> None:
        """Run until asked to stop (SIGTERM/SIGINT or `orch daemon stop`). Workers keep running."""
        os.umask(0o077)  # before anything is created: run dirs, the tmux server, its panes
        self._lock.acquire()
        self.started_at_s = self.clock.now_s()  # after the lock: no other daemon launches from here on
        try:
            check_runs_root(self.ctx.runs_dir, create=True)  # a planted or foreign runs dir: refuse to start
            self._register()
        except BaseException:
            self._lock.release()
            raise
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
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
                self.store.db.execute("UPDATE daemon SET pid = NULL, heartbeat_at = ?, stop_requested = 0, draining = 0 WHERE id = 1", [self.clock.now_s()])
                add_event(self.store, "daemon", "daemon stopped; running workers keep running")
            self._close_idle_launcher()
            with contextlib.suppress(Exception):
                self.notifier.poll()  # what ended in the last pass
                self.notifier.close()
            self.probe.close()
            self._lock.release()

    def _close_idle_launcher(self) -> None:
        """Nothing orch started for itself outlives it: with no attempt left running, the
        launcher's own server (tmux) goes too. Workers still running keep it, to be adopted."""
        with contextlib.suppress(Exception):
            if self.store.query("SELECT 1 FROM attempts WHERE outcome IS NULL LIMIT 1"):
                return
            close = getattr(self.launcher, "kill_server", None)
            if callable(close):
                close()

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
        """Record this daemon in state.db, unless another live daemon is recorded there: a second
        guard beside the lock file, for the same state.db reached through a hard link."""
        create_time = psutil.Process().create_time()
        with self.store.write():
            rows = self.store.query("SELECT pid, proc_create_time FROM daemon WHERE id = 1")
            if rows and rows[0]["pid"] and rows[0]["pid"] != os.getpid() and process_matches(rows[0]["pid"], rows[0]["proc_create_time"]):
                raise DaemonError(
                    f"a daemon is already running for this state.db (pid {rows[0]['pid']}); "
                    "`orch daemon status` shows it, `orch daemon stop` stops it"
                )
            self.store.db.execute(
                "INSERT INTO daemon (id, pid, proc_create_time, started_at, heartbeat_at, draining, stop_requested) "
                "VALUES (1, ?, ?, ?, ?, 0, 0) ON CONFLICT(id) DO UPDATE SET pid = excluded.pid, "
                "proc_create_time = excluded.proc_create_time, started_at = excluded.started_at, "
                "heartbeat_at = excluded.heartbeat_at, draining = 0, stop_requested = 0",
                [os.getpid(), create_time, self.clock.now_s(), self.clock.now_s()],
            )

    # -- one tick --------------------------------------------------------------------------

    def tick(self) -> bool:
        """One pass. Returns True when the daemon should exit (stop requested, or drained)."""
        control = self.store.query("SELECT draining, stop_requested FROM daemon WHERE id = 1")
        draining = bool(control and control[0]["draining"])
        if control and control[0]["stop_requested"]:
            return True
        self._check_disk()
        snapshots = self.probe.snapshot()
        live_before = len(self._exit_files)
        live_count = self.reconcile(snapshots)
        if draining and live_count == 0:
            return True
        if live_count != live_before:  # read again only when an attempt ended (or began) since
            snapshots = self.probe.snapshot()  # after reconcile: memory of attempts that just ended is free
        hold = self._hold_reason()
        if self.launcher.remote:
            schedule_remote(self.store, self.launcher, self.ctx, self.cache, draining=draining,
                            max_in_queue=self.settings.max_in_queue, hold=hold)
        else:
            schedule(self.store, with_memory_held(snapshots, self._ending_mib), self.launcher, self.ctx, self.cache, draining=draining, hold=hold)
        self.notifier.poll()
        self._heartbeat(snapshots)
        record_gpu_samples(  # the memory history the web page and the report draw
            self.store,
            [GpuReading(s.index, s.uuid, s.total_mib, s.used_mib, s.free_mib) for s in snapshots],
            self.clock.now_s(),
        )
        self._exit_files = [
            Path(row["run_dir"]) / EXIT_FILE
            for row in self.store.query("SELECT run_dir FROM attempts WHERE outcome IS NULL")
        ]
        return False

    def _hold_reason(self) -> str | None:
        """Why nothing may start now, for every queued job: a full disk, or an unsafe runs dir."""
        if self.disk is not None and self.disk.full:
            return self.disk.wait_reason()
        try:
            check_runs_root(self.ctx.runs_dir, create=True)
        except OrchError as exc:
            return str(exc)
        return None

    def _check_disk(self) -> None:
        """Read the runs dir's free space; log and record an event when its level changes."""
        before = self.disk.level if self.disk is not None else "ok"
        self.disk = disk_state(self.ctx.runs_dir, self.settings.min_free_mib, self.settings.warn_free_mib)
        if self.disk.level == before:
            return
        if self.disk.full:
            message = self.disk.wait_reason()
        elif self.disk.low:
            message = self.disk.warning()
        else:
            message = f"disk space back: {self.disk.path} has {self.disk.free_mib} MiB free"
        (log.warning if self.disk.level != "ok" else log.info)("%s", message)
        with self.store.write():
            add_event(self.store, "disk", message, data=self.disk.to_json())

    def reconcile(self, snapshots: tuple[GpuSnapshot, ...]) -> int:
        """Bring every live attempt's record up to date; returns how many are still live. Each
        attempt is handled apart: an exception is recorded against that attempt and the others
        (and the loop) go on."""
        by_uuid = {s.uuid: s for s in snapshots}
        self._by_uuid = by_uuid
        self._trees = ProcessTrees()  # one scan of the host's processes per pass, when needed
        self.stopper.new_pass()
        self._ending_mib = Counter()
        still_live = 0
        live = live_attempts(self.store)
        tenants = Counter(a["gpu_uuid"] for a in live)
        self._rates = {a["id"]: r for a, r in ((a, self._rates.get(a["id"])) for a in live) if r is not None}
        try:  # one batched question to the backend per tick (Slurm: squeue)
            remote = self.launcher.poll(live)
        except Exception:  # a failed poll never fails a job: nothing is concluded this tick
            log.warning("executor poll failed", exc_info=True)
            remote = None
        for attempt in live:
            try:
                if self._is_remote(attempt):
                    still_live += self._reconcile_remote(attempt, remote, tenants)
                    continue
                still_live += self._reconcile_one(attempt, by_uuid.get(attempt["gpu_uuid"]), tenants[attempt["gpu_uuid"]])
            except Exception as exc:
                still_live += 1
                self._record_attempt_error(attempt, exc)
        self.output.keep_only(a["id"] for a in live)  # those closed now go at the next pass
        self.stopper.keep_only(a["id"] for a in live)
        return still_live

    def _record_attempt_error(self, attempt: dict[str, Any], exc: Exception) -> None:
        """Record the error against the attempt (once per distinct message); after
        MAX_ATTEMPT_ERRORS passes in a row, stop its group and close it as failed with that reason."""
        message = f"attempt {attempt['n']}: error while checking it: {type(exc).__name__}: {exc}"[:500]
        count = self._attempt_error_counts.get(attempt["id"], 0) + 1
        self._attempt_error_counts[attempt["id"]] = count
        if self._attempt_errors.get(attempt["id"]) != message:
            self._attempt_errors[attempt["id"]] = message
            log.warning("%s", message, exc_info=True)
            with contextlib.suppress(Exception), self.store.write():
                add_event(self.store, "error", message, job_id=attempt["job_id"], attempt_id=attempt["id"])
        if count >= MAX_ATTEMPT_ERRORS:
            with contextlib.suppress(Exception):
                if self._kill(attempt, None):  # its group is stopped across passes first
                    abandon(self.store, attempt, message)

    def _reconcile_one(self, attempt: dict[str, Any], gpu: GpuSnapshot | None, tenants: int) -> int:
        run_dir = Path(attempt["run_dir"])
        obs = observe(run_dir, self.clock.now_s(), attempt)
        if not obs.pid_file_present and obs.exit_record is None and attempt["window_id"] and attempt["launcher"] == self.launcher.name:
            try:
                obs = replace(obs, window_alive=bool(self.launcher.window_alive(attempt["window_id"])))
            except Exception:  # the launcher could not tell: wait out the grace period
                log.warning("cannot check window %s of attempt %s", attempt["window_id"], attempt["id"], exc_info=True)
        obs = self._with_stdout_progress(attempt, obs)
        verdict = judge(attempt, obs, float(attempt["hang_timeout_s"]), self.started_at_s)
        if verdict is Verdict.LOST and not obs.pid_file_present and not mark_lost(run_dir):
            verdict = Verdict.PENDING  # its wrapper recorded itself just now: judge it next pass
        if verdict in (Verdict.ALIVE, Verdict.HUNG, Verdict.PENDING):
            self._track(attempt, obs, gpu)
            self._learn_rate(attempt, obs, tenants)
        disk_full = self.disk is not None and self.disk.full
        if verdict is Verdict.HUNG and not attempt["kill_requested"]:
            update_attempt(self.store, attempt["id"], kill_requested="hung")
            with self.store.write():
                add_event(self.store, "hung", f"attempt {attempt['n']} silent for more than {attempt['hang_timeout_s']:.0f} s (no progress.jsonl line, stdout.log not growing): killing it",
                          job_id=attempt["job_id"], attempt_id=attempt["id"])
            attempt = {**attempt, "kill_requested": "hung"}
        if verdict in (Verdict.ALIVE, Verdict.HUNG) and attempt["kill_requested"]:
            # signalled now, confirmed on later passes; its end is recorded once a pass finds
            # the wrapper ended (FINISHED or LOST below), never while the tick waits
            self._kill(attempt, obs)
            return 1
        hung = attempt["kill_requested"] == "hung"
        if verdict in (Verdict.FINISHED, Verdict.LOST) and not self._kill(attempt, obs):
            self._ending_mib.update(ending_peaks_mib(attempt))  # counted as held until the group is gone
            return 1  # members of its group live on: stopped across passes before it may end
        if verdict is Verdict.FINISHED:
            self._learn_host(attempt)
            complete(self.store, attempt, obs, self.cache, disk_full_now=disk_full, hung=hung)
            self._cleanup(attempt)
        elif verdict is Verdict.LOST:
            if (why := disagreement(attempt, obs)) is not None:
                log.warning("attempt %s is not ours: %s; treating it as lost", attempt["id"], why)
            complete(self.store, attempt, obs, self.cache, lost=True, disk_full_now=disk_full, hung=hung)
            self._cleanup(attempt)
        else:
            return 1
        self._attempt_errors.pop(attempt["id"], None)
        self._attempt_error_counts.pop(attempt["id"], None)
        return 0

    def _is_remote(self, attempt: dict[str, Any]) -> bool:
        return bool(self.launcher.remote and (attempt.get("executor") or attempt.get("launcher")) in (None, self.launcher.name))

    def _cleanup(self, attempt: dict[str, Any]) -> None:
        """Once the attempt's end is recorded: close what its executor kept open (a tmux window)."""
        if self.store.query("SELECT 1 FROM attempts WHERE id = ? AND outcome IS NOT NULL", [attempt["id"]]):
            self.launcher.cleanup(attempt)

    def _reconcile_remote(
        self, attempt: dict[str, Any], remote: dict[int, RemoteStatus] | None, tenants: Counter[str],
    ) -> int:
        """One attempt the cluster owns: Slurm's state for liveness, the run dir for the end."""
        obs = observe(Path(attempt["run_dir"]), self.clock.now_s(), attempt)
        status = (remote or {}).get(int(attempt["id"])) if remote is not None else None
        if status is not None:
            shown = status.state if status.kind != "queued" else f"{status.state} ({status.reason})"
            fields: dict[str, Any] = {}
            if shown != attempt.get("executor_state"):
                fields["executor_state"] = shown
            if status.job_id and not attempt.get("executor_id"):
                fields["executor_id"] = status.job_id  # adopted by name after a crash mid-submit
            if fields:
                update_attempt(self.store, attempt["id"], **fields)
                attempt = {**attempt, **fields}
        obs = remote_observation(obs, status)
        obs = self._with_stdout_progress(attempt, obs)
        end = remote_end(attempt, obs, status, remote is not None, self.started_at_s)
        if end is None:
            verdict = judge(attempt, obs, float(attempt["hang_timeout_s"]), self.started_at_s) if obs.pid_record else Verdict.PENDING
            if verdict is Verdict.LOST:
                verdict = Verdict.PENDING  # only Slurm's word ends a remote attempt without exit.json
        else:
            verdict = Verdict.FINISHED if end == "finished" else Verdict.LOST
        if verdict in (Verdict.ALIVE, Verdict.HUNG, Verdict.PENDING):
            # its pid and group live on the node, not here: never recorded as killable locally
            self._track(attempt, replace(obs, pid_record=None), None)
            self._learn_rate(attempt, obs, tenants[attempt["gpu_uuid"]])
        if verdict in (Verdict.ALIVE, Verdict.PENDING) and attempt["kill_requested"]:
            self._kill(attempt, obs)
            return 1
        if verdict is Verdict.HUNG:
            update_attempt(self.store, attempt["id"], kill_requested="hung")
            self._kill(attempt, obs)
            return 1
        if verdict is Verdict.FINISHED:
            complete(self.store, attempt, obs, self.cache)
            return 0
        if verdict is Verdict.LOST:
            assert isinstance(end, tuple)
            complete(self.store, attempt, obs, self.cache, lost=True, remote_end=end)
            self._cancel_sent.discard(int(attempt["id"]))
            return 0
        return 1

    def _with_stdout_progress(self, attempt: dict[str, Any], obs: Observation) -> Observation:
        """A worker without progress.jsonl: its progress as parsed from the new part of stdout.log."""
        if obs.last_progress_at is not None or not obs.pid_file_present or not follows_stdout(attempt["worker"]):
            return obs
        regex = job_worker_output(attempt).get("progress_regex")
        try:
            parsed = self.output.progress(int(attempt["id"]), Path(attempt["run_dir"]), regex if isinstance(regex, str) else None)
        except Exception:  # output we cannot parse must not stop the pass: progress is only shown
            log.warning("cannot read the output of attempt %s", attempt["id"], exc_info=True)
            return obs
        return replace(obs, last_progress=parsed) if parsed is not None else obs

    def _track(self, attempt: dict[str, Any], obs: Observation, gpu: GpuSnapshot | None) -> None:
        fields: dict[str, Any] = {}
        pid = attempt["pid"]
        if attempt["pgid"] is None:
            group = proven_group(attempt, obs)
            if group is not None:  # the wrapper leads its own group: pgid = its pid
                fields.update(pid=group[0], pgid=group[0], proc_create_time=group[1])
                pid = group[0]
        alive = obs.launcher_alive if obs.launcher_alive is not None else obs.process_alive
        if gpu is not None and alive and pid:
            tree = self._trees.pids(int(pid))
            held = gpu.memory_of(tree)
            if held != attempt["held_mib"]:
                fields["held_mib"] = held
            if held > attempt["peak_mib"]:
                fields["peak_mib"] = held
            fields.update(self.resources.fields(attempt, list(tree), self._by_uuid))
            held = int(fields.get("held_mib", held))
            progressed = bool(obs.last_progress and (obs.last_progress.get("step") or 0) >= 1)
            if not attempt["reached_peak"] and (progressed or held >= attempt["predicted_peak_mib"]):
                fields["reached_peak"] = 1
        if obs.last_progress_at and obs.last_progress_at != attempt["last_progress_at"]:
            fields["last_progress_at"] = obs.last_progress_at
            fields["progress_json"] = json.dumps(obs.last_progress) if obs.last_progress else None
        elif obs.last_progress_at is None and obs.last_progress is not None:  # parsed from stdout
            dumped = json.dumps(obs.last_progress)
            if dumped != attempt["progress_json"]:
                fields["progress_json"] = dumped
                fields["last_progress_at"] = obs.last_output_at
        if fields:
            update_attempt(self.store, attempt["id"], **fields)

    def _learn_host(self, attempt: dict[str, Any]) -> None:
        """A finished attempt's host RAM and CPU peaks teach its shape."""
        self.resources.forget(int(attempt["id"]))
        if not attempt.get("host_peak_mib"):
            return
        try:
            job = self.store.query("SELECT * FROM jobs WHERE id = ?", [attempt["job_id"]])[0]
            learn_host_shape(self.store, attempt_shape_key(job, attempt, self.cache),
                             int(attempt["host_peak_mib"]), attempt.get("cpu_peak_cores"))
        except Exception:  # a bad config row must not stop reconciling the others
            log.warning("cannot record the host memory of attempt %s", attempt["id"], exc_info=True)

    def _learn_rate(self, attempt: dict[str, Any], obs: Any, tenants: int) -> None:
        """Samples/s of the attempt between two of its progress readings, recorded with the
        number of attempts on its card when both readings saw the same number."""
        step = (obs.last_progress or {}).get("step")
        # progress parsed from stdout is as old as the log's last write
        read_at = obs.last_progress_at if obs.last_progress_at is not None else obs.last_output_at
        if not isinstance(step, int) or isinstance(step, bool) or read_at is None:
            return
        previous = self._rates.get(attempt["id"])
        self._rates[attempt["id"]] = (step, float(read_at), tenants)
        if previous is None or previous[2] != tenants:
            return
        try:
            learn_rate(self.store, attempt, previous[:2], (step, float(read_at)), tenants, self.cache)
        except Exception:  # a bad config row must not stop reconciling the others
            log.warning("cannot record the rate of attempt %s", attempt["id"], exc_info=True)

    def _kill(self, attempt: dict[str, Any], obs: Observation | None) -> bool:
        """Move the stop of the attempt's process group one step on (SIGTERM, SIGKILL after the
        grace), only when orch can prove it started it; never waits. True once nothing of the
        group lives (a remote attempt: False, Slurm says when it ended)."""
        if self._is_remote(attempt):  # the cluster owns the process: scancel, then Slurm says when it ended
            if int(attempt["id"]) not in self._cancel_sent:
                try:
                    self.launcher.cancel(attempt)
                    self._cancel_sent.add(int(attempt["id"]))
                except Exception:  # tried again next pass
                    log.warning("cannot cancel attempt %s", attempt["id"], exc_info=True)
            return False
        group = proven_group(attempt, obs)
        if group is None:
            if obs is not None and (obs.launcher_alive or obs.process_alive):
                log.warning("attempt %s: no process orch can prove it started; nothing signalled", attempt["id"])
            return True
        return self.stopper.stop(int(attempt["id"]), *group)

    def _heartbeat(self, snapshots: tuple[GpuSnapshot, ...]) -> None:
        if self.ctx.host is not None:
            reading = self.ctx.host.snapshot()
            ours = sum(int(r["host_held_mib"] or 0) for r in self.store.query(
                "SELECT host_held_mib FROM attempts WHERE outcome IS NULL"))
            write_host_reading(self.store, {
                "total_mib": reading.total_mib, "available_mib": reading.available_mib, "ours_mib": ours,
                "reserve_mib": self.ctx.host_reserve_mib, "cpus": reading.cpus,
            })
        with self.store.write():
            self.store.db.execute(
                "UPDATE daemon SET heartbeat_at = ?, gpus_json = ? WHERE id = 1",
                [self.clock.now_s(), json.dumps([asdict(s) for s in snapshots])],
            )
            self.store.db.execute(
                "UPDATE daemon SET disk_json = ? WHERE id = 1",
                [json.dumps(self.disk.to_json()) if self.disk is not None else None],
            )
