"""The attempt watcher: what a pass does for each live attempt, wherever it runs.

One path for every attempt: look (its run dir, and the backend's word where the backend owns
the process), judge, track its memory and rate, step its stop, complete it. Where an attempt
runs decides only how it is looked at and how it is stopped: on this host by its run dir and
its proven process group; on a cluster (Slurm) by the cluster's word, scancel and the run dir.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator import faults
from orchestrator.attempts.containment import StrayHunter, record_hunted
from orchestrator.attempts.disk_space import is_disk_full_error, orchs_own_error
from orchestrator.attempts.history_follow import HistoryFollower
from orchestrator.attempts.kills import GroupStopper, ending_peaks_mib
from orchestrator.attempts.observe_cache import ObserveCache
from orchestrator.attempts.outcomes import abandon, complete
from orchestrator.attempts.reconcile import (
    Verdict,
    disagreement,
    judge,
    observe,
    proven_group,
)
from orchestrator.attempts.resource_use import ResourceTracker
from orchestrator.attempts.share_record import read_share
from orchestrator.attempts.silence import Silences
from orchestrator.attempts.startup_lesson import learn_startup
from orchestrator.attempts.stdout_follow import OutputFollower, follows_stdout
from orchestrator.attempts.warm_peak import shared_base_peak_mib
from orchestrator.clock import Clock
from orchestrator.daemon.attempt_lessons import AttemptLessons
from orchestrator.daemon.disk_hold import DiskHold
from orchestrator.daemon.settings import MAX_ATTEMPT_ERRORS, WRAPPER_EXIT_WAIT_S, run_dir_path
from orchestrator.executors.base import Executor, RemoteStatus
from orchestrator.executors.launch_age import launch_age
from orchestrator.executors.lost_marker import mark_lost
from orchestrator.executors.observation import Observation
from orchestrator.executors.remote_verdict import (
    AWAIT,
    ClusterEnd,
    refresh_dir,
    remote_end,
    remote_observation,
)
from orchestrator.executors.slurm.time_limits import time_limit_of
from orchestrator.executors.wake import wait_gone
from orchestrator.gpu.attribution import ProcessTrees
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.lifecycle import KillRequest
from orchestrator.prediction.fused_groups import shares_base
from orchestrator.prediction.startup import HeldReadings
from orchestrator.rundir_files import RunDir
from orchestrator.scheduling.state import SchedulerState
from orchestrator.store.attempts import attempt_closed, update_attempt
from orchestrator.store.db import Store
from orchestrator.store.endings import mark_hung
from orchestrator.store.jobs import add_event
from orchestrator.store.queue import live_attempts_with_jobs
from orchestrator.store.rows import Attempt, Job

log = logging.getLogger(__name__)

LIVE = (Verdict.ALIVE, Verdict.HUNG, Verdict.PENDING)
NEVER_LAUNCHED = "its launch never completed (no window or process was recorded for it)"
ENDED = (Verdict.FINISHED, Verdict.LOST)


@dataclass(frozen=True)
class Look:
    """One look at a live attempt: what was seen, the verdict, and how it may be stopped."""

    attempt: Attempt  # with what the backend said this pass recorded on it
    obs: Observation
    verdict: Verdict
    elsewhere: bool  # its processes run on a cluster's node: never tracked or signalled here
    stoppable: tuple[Verdict, ...]  # verdicts under which a requested stop is carried out now
    end: ClusterEnd | None = None  # how the cluster says it ended, where it decided


class AttemptWatcher:
    """Per-attempt work of a pass; the daemon owns one and calls `reconcile` every pass."""

    def __init__(self, store: Store, clock: Clock, executor: Executor, scheduler: SchedulerState,
                 runs_dir: Path, resources: ResourceTracker, disk: DiskHold) -> None:
        self.store = store
        self.clock = clock
        self.executor = executor
        self.scheduler = scheduler
        self.resources = resources
        self.disk = disk
        self.started_at_s: float | None = None  # wall time at this daemon's start (as recorded, not compared live)
        # attempts with an id up to this one were claimed before this daemon started (ids only
        # grow: no clock can make an attempt this daemon claimed look adopted); None: not known
        self.adopted_up_to_id: int | None = None
        self.observed = ObserveCache(clock.monotonic_s)  # run-dir reads and process checks kept between passes
        self.silences = Silences(clock.monotonic_s)  # hang and launch grace: the daemon's own measure
        self.output = OutputFollower()  # progress of workers that write no progress.jsonl
        self.history = HistoryFollower(store)  # every metric reported, kept per attempt in the database
        self.stopper = GroupStopper(clock)  # local groups being stopped, across passes
        self.hunter = StrayHunter(clock, runs_dir)  # then their processes outside the group
        self.ending_mib: Counter[str] = Counter()  # per card: ended attempts whose group is not gone yet
        self._by_uuid: dict[str, GpuSnapshot] = {}  # this pass's cards, for a gang's other ranks
        self._ended: list[Attempt] = []  # attempts closed this pass: windows closed after launching
        self.lessons = AttemptLessons(store, scheduler, resources)  # host peaks and rates they teach
        self.startup_readings = HeldReadings()  # GPU memory of attempts before their first step
        self._attempt_errors: dict[int, str] = {}  # last error recorded per attempt, so it is not repeated
        self._attempt_error_counts: dict[int, int] = {}  # passes in a row that failed on the attempt
        self._abandoning: set[int] = set()  # attempts being stopped after too many errors in a row
        self._trees = ProcessTrees()
        self._cancel_sent: set[int] = set()  # cluster attempts whose cancel reached the backend

    def reconcile(self, snapshots: tuple[GpuSnapshot, ...], only: Collection[Path] | None = None) -> int:
        """Bring every live attempt's record up to date (`only`: those with these run dirs;
        the others count as live, unread); returns how many are still live. Each attempt is
        handled apart: an exception is recorded against that attempt and the others (and the
        loop) go on."""
        self._by_uuid = {s.uuid: s for s in snapshots}
        # the process table: scanned once when needed
        self._trees.new_pass(p.pid for s in snapshots for p in s.processes)
        self.resources.new_pass()
        self.stopper.new_pass()
        self.hunter.new_pass()
        self.ending_mib = Counter()
        still_live = 0
        live, jobs = live_attempts_with_jobs(self.store)
        tenants = Counter(a.gpu_uuid for a in live)
        self.lessons.keep_only(a.id for a in live)
        try:  # one batched question to the backend per tick (Slurm: squeue)
            statuses = self.executor.observe([(a, jobs[a.job_id]) for a in live])
        except Exception:  # a failed poll never fails a job: nothing is concluded this tick
            log.warning("executor poll failed", exc_info=True)
            statuses = None
        wanted = None if only is None else {str(p) for p in only}
        for attempt in live:
            if wanted is not None:
                if attempt.run_dir not in wanted:
                    still_live += 1
                    continue
                if (
                    attempt.pid
                    and attempt.proc_create_time is not None
                    and os.path.lexists(RunDir(attempt.run_dir).exit)
                ):
                    wait_gone(attempt.pid, attempt.proc_create_time, WRAPPER_EXIT_WAIT_S)
            if attempt.id in self._abandoning:
                still_live += self._finish_abandoning(attempt, jobs.get(attempt.job_id), statuses)
                continue
            try:
                still_live += self._reconcile_one(attempt, jobs[attempt.job_id], statuses, tenants[attempt.gpu_uuid])
                self._attempt_error_counts.pop(attempt.id, None)  # errors count in a row only
            except Exception as exc:
                still_live += 1
                if is_disk_full_error(exc):  # holds the decision, never makes one: tried again next pass
                    self.disk.note_full(exc)
                if orchs_own_error(exc):  # never the attempt's doing
                    continue
                self._record_attempt_error(attempt, jobs.get(attempt.job_id), exc, statuses)
        self.output.keep_only(a.id for a in live)  # those closed now go at the next pass
        self.silences.keep_only(a.id for a in live)
        self.startup_readings.keep_only(a.id for a in live)
        self.history.keep_only(a.id for a in live)
        if wanted is None:
            self.observed.end_pass(a.run_dir for a in live)
        self.stopper.keep_only(a.id for a in live)
        self.hunter.keep_only({a.id for a in live})
        if wanted is None:
            self._abandoning &= {a.id for a in live}
            self.resources.keep_only(a.id for a in live)
        return still_live

    def _record_attempt_error(
        self,
        attempt: Attempt,
        job: Job | None,
        exc: Exception,
        statuses: dict[int, RemoteStatus] | None,
    ) -> None:
        """Record the error against the attempt (once per distinct message); after
        MAX_ATTEMPT_ERRORS passes in a row, stop its group and close it as failed with that reason."""
        message = f"attempt {attempt.n}: error while checking it: {type(exc).__name__}: {exc}"[:500]
        count = self._attempt_error_counts.get(attempt.id, 0) + 1
        self._attempt_error_counts[attempt.id] = count
        if self._attempt_errors.get(attempt.id) != message:
            self._attempt_errors[attempt.id] = message
            log.warning("%s", message, exc_info=True)
            with contextlib.suppress(Exception), self.store.write():
                add_event(self.store, "error", message, job_id=attempt.job_id, attempt_id=attempt.id)
        if count >= MAX_ATTEMPT_ERRORS:
            self._abandoning.add(attempt.id)  # from the next pass: its group stopped, then closed
            self._finish_abandoning(attempt, job, statuses)

    def _finish_abandoning(self, attempt: Attempt, job: Job | None, statuses: dict[int, RemoteStatus] | None) -> int:
        """An attempt given up on after errors in a row: its proven group is stopped across
        passes (SIGTERM, SIGKILL after the grace), or cancelled on its cluster until the cluster
        says it ended; then it is closed as failed. Returns 1 while it is still live."""
        message = self._attempt_errors.get(attempt.id, f"attempt {attempt.n}: errors while checking it")
        try:
            obs = observe(Path(attempt.run_dir), self.clock.now_s(), attempt)
        except Exception:  # what failed the checks may fail this too: the launcher record is enough
            obs = None
        try:
            if job is not None and not self._stop(attempt, job, obs) and not self._cluster_ended(attempt, statuses):
                return 1
            if abandon(self.store, attempt, message, obs):
                self._abandoning.discard(attempt.id)
                return 0
        except Exception:
            log.exception("cannot close attempt %s after errors in a row", attempt.id)
        return 1

    def _reconcile_one(self, attempt: Attempt, job: Job, statuses: dict[int, RemoteStatus] | None, tenants: int) -> int:
        """Look, track, stop what was asked to stop, complete what ended; 1 while it is live."""
        look = (
            self._look_elsewhere(attempt, job, statuses)
            if self._runs_elsewhere(attempt)
            else self._look_here(attempt, job)
        )
        attempt, obs, verdict = look.attempt, look.obs, look.verdict
        if verdict in LIVE:
            learn_startup(
                self.store,
                attempt,
                job,
                obs,
                self.clock.now_s(),
                watched_s=self.silences.watched_s(attempt.id),
                adopted=self.adopted(attempt),
                readings=self.startup_readings,
            )  # before _track stores the progress
            # a process on a cluster's node: its pid and group are never recorded as killable here
            self._track(
                attempt,
                replace(obs, pid_record=None) if look.elsewhere else obs,
                None if look.elsewhere else self._by_uuid.get(attempt.gpu_uuid),
                job,
            )
            self.lessons.rate(attempt, job, obs, tenants)
            self.history.keep(attempt.id, Path(attempt.run_dir), self.output.take_points(attempt.id), ended=False)
        if verdict is Verdict.HUNG and self.disk.silenced(job.hang_timeout_s):
            verdict = Verdict.ALIVE  # no progress line or log could be written: silence proves nothing
        if verdict is Verdict.HUNG and attempt.kill_requested is None:  # a cancel or retry asked for stays
            how = "cancelling" if look.elsewhere else "killing"
            attempt = mark_hung(
                self.store,
                attempt,
                f"attempt {attempt.n} silent for more than {job.hang_timeout_s:.0f} s (no "
                f"progress.jsonl line, stdout.log not growing): {how} it",
            )
            faults.reach("after_mark_hung")
        if verdict in look.stoppable and attempt.kill_requested:
            # signalled now, confirmed on later passes; its end is recorded once a pass finds
            # it ended (FINISHED or LOST below), never while the tick waits
            self._stop(attempt, job, obs)
            return 1
        if verdict not in ENDED:
            return 1
        if not look.elsewhere:  # its processes must all be gone before it may end: say what that took
            if not self._stop(attempt, job, obs):
                # counted as held until the group is gone
                self.ending_mib.update(
                    ending_peaks_mib(
                        attempt.gpu_uuid,
                        attempt.peak_mib,
                        attempt.predicted_peak_mib,
                        attempt.peak_by_gpu,
                    )
                )
                return 1
            record_hunted(self.store, attempt, obs, self.hunter.hunted(attempt.id))
        if verdict is Verdict.LOST and look.end is None and (why := disagreement(attempt, obs)) is not None:
            log.warning("attempt %s is not ours: %s; treating it as lost", attempt.id, why)
        if verdict is Verdict.FINISHED:  # a lost attempt's peak is partial: it must not teach
            self.lessons.host(attempt, job)
        self.history.keep(attempt.id, Path(attempt.run_dir), self.output.take_points(attempt.id, True), ended=True)
        never = verdict is Verdict.LOST and attempt.executor is None and not (obs.pid_file_present or look.elsewhere)
        complete(
            self.store,
            attempt,
            obs,
            self.scheduler.shapes,
            lost=verdict is Verdict.LOST,
            disk_full_now=self.disk.full,
            hung=attempt.kill_requested is KillRequest.HUNG,
            remote_end=look.end,
            not_started=NEVER_LAUNCHED if never else None,
        )
        self._ended.append(attempt)
        self._cancel_sent.discard(attempt.id)
        self._attempt_errors.pop(attempt.id, None)
        self._attempt_error_counts.pop(attempt.id, None)
        return 0

    def adopted(self, attempt: Attempt) -> bool:
        """Claimed before this daemon started (by a daemon since stopped or dead)."""
        return self.adopted_up_to_id is not None and attempt.id <= self.adopted_up_to_id

    def run_age_s(self, attempt: Attempt) -> float | None:
        """How long the live attempt has run, on the monotonic clock (a wall-clock step moves no
        expected end built on it); None where the recorded times were not trusted: the age is
        then a lower bound only, and a pace worked out from it would end the attempt too early."""
        age = launch_age(self.silences.watched_s(attempt.id), self.adopted(attempt), attempt.started_at,
                         self.started_at_s)
        return None if age.distrusted else age.age_s

    def _cluster_ended(self, attempt: Attempt, statuses: dict[int, RemoteStatus] | None) -> bool:
        """The cluster says the attempt's job has left its queue (a cancel took effect)."""
        status = statuses.get(attempt.id) if statuses is not None else None
        return self._runs_elsewhere(attempt) and status is not None and status.ended

    def _runs_elsewhere(self, attempt: Attempt) -> bool:
        """Whether the attempt's processes belong to the executor's cluster, not this host."""
        return bool(self.executor.remote and attempt.executor in (None, self.executor.name))

    def _look_here(self, attempt: Attempt, job: Job) -> Look:
        """An attempt on this host: its run dir, the wrapper orch started, its window."""
        run_dir = run_dir_path(attempt.run_dir)  # every live attempt, every pass
        obs = observe(run_dir, self.clock.now_s(), attempt, self.observed, job.hang_timeout_s)
        if not obs.pid_file_present and obs.exit_record is None:
            try:
                obs = replace(obs, started_alive=self.executor.started_alive(attempt))
            except Exception:  # the executor could not tell: wait out the grace period
                log.warning("cannot check the window of attempt %s", attempt.id, exc_info=True)
        obs = self._with_stdout_progress(attempt, job, obs)
        obs = replace(obs, silent_s=self.silences.silent_s(attempt.id, obs))
        verdict = judge(attempt, obs, job.hang_timeout_s, self.adopted(attempt))
        if verdict is Verdict.LOST and not obs.pid_file_present and not mark_lost(run_dir):
            verdict = Verdict.PENDING  # its wrapper recorded itself just now: judge it next pass
        # stopped only once pid.json names a group orch can prove it started
        return Look(attempt, obs, verdict, elsewhere=False, stoppable=(Verdict.ALIVE, Verdict.HUNG))

    def _look_elsewhere(self, attempt: Attempt, job: Job, statuses: dict[int, RemoteStatus] | None) -> Look:
        """An attempt the cluster owns: Slurm's state for liveness, the run dir for the end."""
        status = statuses.get(attempt.id) if statuses is not None else None
        ended = status is not None and status.ended
        if ended:
            refresh_dir(attempt.run_dir)  # a shared filesystem shows what the node wrote
        obs = observe(Path(attempt.run_dir), self.clock.now_s(), attempt)
        if status is not None:
            shown = status.state if status.kind != "queued" else f"{status.state} ({status.reason})"
            fields: dict[str, Any] = {}
            if shown != attempt.executor_state:
                fields["executor_state"] = shown
            if status.job_id and not attempt.executor_id:
                fields["executor_id"] = status.job_id  # adopted by name after a crash mid-submit
            if fields:
                update_attempt(self.store, attempt.id, **fields)
                attempt = replace(attempt, **fields)
        obs = remote_observation(obs, status)
        obs = self._with_stdout_progress(attempt, job, obs)
        obs = replace(obs, silent_s=self.silences.silent_s(attempt.id, obs))
        polled = statuses is not None and self.executor.answered_now
        launch = launch_age(self.silences.watched_s(attempt.id), self.adopted(attempt), attempt.started_at,
                            self.started_at_s)
        end = remote_end(
            attempt,
            obs,
            status,
            polled,
            launch,
            time_limit_of(self.store, attempt, job) if ended else None,
        )
        cluster_end: ClusterEnd | None = None
        if end == AWAIT:  # stopped from outside: Slurm's final word (TIMEOUT, PREEMPTED, ...) decides
            self.executor.expedite()
            verdict = Verdict.PENDING
        elif end is None:
            verdict = (
                judge(attempt, obs, job.hang_timeout_s, self.adopted(attempt))
                if obs.pid_record
                else Verdict.PENDING
            )
            if verdict is Verdict.LOST:
                verdict = Verdict.PENDING  # only Slurm's word ends a remote attempt without exit.json
        elif isinstance(end, ClusterEnd):
            verdict, cluster_end = Verdict.LOST, end
            if obs.exit_record is None and not obs.pid_file_present and not mark_lost(Path(attempt.run_dir)):
                # its wrapper recorded itself just now (a submission that arrived late): judge it next pass
                verdict, cluster_end = Verdict.PENDING, None
        else:
            verdict = Verdict.FINISHED
        return Look(attempt, obs, verdict, elsewhere=True, stoppable=LIVE, end=cluster_end)

    def close_ended(self) -> None:
        """Once their ends are recorded: close what the executor kept open (tmux windows)."""
        ended, self._ended = self._ended, []
        try:
            closed = [attempt for attempt in ended if attempt_closed(self.store, attempt.id)]
            if closed:
                self.executor.cleanup(closed)
        except Exception:  # a window left open is only untidy
            log.warning("cannot close the windows of attempts %s", ", ".join(str(a.id) for a in ended), exc_info=True)

    def _with_stdout_progress(self, attempt: Attempt, job: Job, obs: Observation) -> Observation:
        """A worker without progress.jsonl: its progress as parsed from the new part of stdout.log."""
        if obs.last_progress_at is not None or not obs.pid_file_present or not follows_stdout(job.worker):
            return obs
        regex = job.worker_output.get("progress_regex")
        try:
            parsed = self.output.progress(attempt.id, Path(attempt.run_dir), regex if isinstance(regex, str) else None)
        except Exception:  # output we cannot parse must not stop the pass: progress is only shown
            log.warning("cannot read the output of attempt %s", attempt.id, exc_info=True)
            return obs
        return replace(obs, last_progress=parsed) if parsed is not None else obs

    def _track(self, attempt: Attempt, obs: Observation, gpu: GpuSnapshot | None, job: Job) -> None:
        fields: dict[str, Any] = {}
        pid = attempt.pid
        if attempt.pgid is None:
            group = proven_group(attempt, obs)
            if group is not None:  # the wrapper leads its own group: pgid = its pid
                fields.update(pid=group[0], pgid=group[0], proc_create_time=group[1])
                pid = group[0]
        alive = obs.launcher_alive if obs.launcher_alive is not None else obs.process_alive
        if gpu is not None and alive and pid:
            host_due = self.resources.host_due(attempt)
            tree = self._trees.pids(int(pid), fresh=host_due)
            held = gpu.memory_of(tree)
            if held != attempt.held_mib:
                fields["held_mib"] = held
            if (peak := max(held, shared_base_peak_mib(job, obs.last_progress))) > attempt.peak_mib:
                fields["peak_mib"] = peak  # a warm process's job: the peak its worker reports
            fields.update(self.resources.fields(attempt, list(tree), self._by_uuid, host_due))
            held = int(fields.get("held_mib", held))
            progressed = bool(obs.last_progress and (obs.last_progress.get("step") or 0) >= 1)
            if not progressed:  # what its start-up holds, for start-up overlap
                self.startup_readings.note(attempt.id, self.clock.now_s(), held)
            if not attempt.reached_peak and (progressed or held >= attempt.predicted_peak_mib):
                fields["reached_peak"] = 1
        if attempt.share_process is None and shares_base(job) and obs.last_progress_at != attempt.last_progress_at:
            # until its client says which warm process took it (written before the job's first
            # progress line), read when its progress moved: not every pass
            record = read_share(attempt.run_dir)
            if record is not None:
                fields.update(record.fields())
        if obs.last_progress_at and obs.last_progress_at != attempt.last_progress_at:
            fields["last_progress_at"] = obs.last_progress_at
            fields["progress_json"] = json.dumps(obs.last_progress) if obs.last_progress else None
        elif obs.last_progress_at is None and obs.last_progress is not None and obs.last_progress != attempt.progress:
            fields["progress_json"] = json.dumps(obs.last_progress)  # parsed from stdout
            fields["last_progress_at"] = obs.last_output_at
        if fields:
            update_attempt(self.store, attempt.id, **fields)

    def _stop(self, attempt: Attempt, job: Job, obs: Observation | None) -> bool:
        """Move the stop of the attempt's process group one step on (SIGTERM, SIGKILL after the
        grace), only when orch can prove it started it; never waits. True once nothing of the
        group lives (a remote attempt: False, Slurm says when it ended)."""
        if self._runs_elsewhere(attempt):  # the cluster owns the process: scancel, then Slurm says when it ended
            if attempt.id not in self._cancel_sent:
                try:
                    self.executor.stop(attempt, job)
                    self._cancel_sent.add(attempt.id)
                except Exception:  # tried again next pass
                    log.warning("cannot cancel attempt %s", attempt.id, exc_info=True)
            return False
        group = proven_group(attempt, obs)
        if group is None:
            if obs is not None and (obs.launcher_alive or obs.process_alive):
                log.warning("attempt %s: no process orch can prove it started; nothing signalled", attempt.id)
        elif not self.stopper.stop(attempt.id, *group):
            return False
        # the group is gone: what left it (setsid, double fork) is found by cgroup or mark
        return self.hunter.stop(attempt.id)
