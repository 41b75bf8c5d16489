"""The Slurm executor: one `sbatch` job per attempt, state from one batched squeue per tick.

The batch script `exec`s the same wrapper as every other executor, so pid.json, exit.json,
stdout.log, result.json and the wrapper's own GPU peak land in the run dir on the shared
filesystem; Slurm only adds whether the job waits, runs, or was ended by the cluster (NODE_FAIL,
PREEMPTED, TIMEOUT, ...). Jobs are submitted `--no-requeue`: orch's ladder resubmits, as a new
job. A failed or slow Slurm command never fails an attempt: poll answers None and backs off.
"""

from __future__ import annotations

import getpass
import logging
import math
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.clock import SYSTEM_CLOCK, Clock
from orchestrator.errors import ClusterBusy, LauncherError, UsageError
from orchestrator.executors.base import (
    Executor,
    LaunchHandle,
    LaunchSpec,
    RemoteStatus,
    attach_argv,
)
from orchestrator.executors.slurm.parse import (
    JOB_NAME_PREFIX,
    STUCK_WORDS,
    Request,
    SlurmJob,
    classify_state,
    is_transient_refusal,
    job_name,
    never_clears,
    parse_node_shards,
    parse_sacct,
    parse_scontrol_jobs,
    parse_squeue,
    sbatch_argv,
    sbatch_script,
    settings_from_json,
    shards_for,
    warning_s,
)
from orchestrator.executors.wrapper.run import wrapper_argv
from orchestrator.rundir_files import RunDir
from orchestrator.store.rows import Attempt, Job

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 20.0
BACKOFF_MAX_S = 60.0
POLL_S = 30.0  # how often Slurm is asked about our jobs at steady state
EXIT_GRACE_S = 60.0  # NFS's attribute cache: how long an exit record may take to be seen here
SUBMIT_FOLLOW_UPS_S = (2.0, 6.0, 14.0)  # asks after a submission: it starts, or fails at once
EXPEDITE_S = 5.0  # the soonest a waiting attempt's end makes Slurm be asked again
MAX_LOOKUPS = 16  # ended jobs looked up one by one (scontrol/sacct -j ID) in one ask, at most


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    shard_mib: int | None = None  # MiB one shard stands for; None: derived from the node and GPU size
    max_in_queue: int = 16  # attempts orch keeps submitted (pending + running) at once
    poll_s: float = POLL_S  # Slurm is asked about our jobs this often at steady state
    exit_grace_s: float = EXIT_GRACE_S  # a job out of the queue waits this long for its exit record


def _run(*argv: str, timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)


class SlurmExecutor(Executor):
    name = "slurm"
    remote = True

    def __init__(self, options: SlurmOptions, gpu_mib: int | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        missing = [tool for tool in ("sbatch", "squeue", "scancel", "scontrol") if shutil.which(tool) is None]
        if missing:
            raise LauncherError(f"Slurm's {', '.join(missing)} not found on PATH: run the daemon on a login node")
        self.options = options
        self.user = getpass.getuser()
        self.shards_per_gpu: int | None = None
        self.shard_mib: int | None = None
        self.accounting = False
        self._failures = 0
        self.clock = clock  # the poll backoff's
        self._next_poll_at = 0.0
        self._polled_at = -math.inf  # when Slurm last answered a poll
        self._soon: set[float] = set()  # earlier asks wanted (after a submission, an end)
        self._statuses: dict[int, RemoteStatus] = {}  # the last answer, by attempt id
        self._gone_at: dict[int, float] = {}  # attempt id -> when its job was first out of squeue
        self._ended: dict[str, SlurmJob] = {}  # Slurm job id -> its final state, once known
        self.answered_now = False  # the last poll asked Slurm (False: the last answer again)
        self._discover(gpu_mib)

    def _discover(self, gpu_mib: int | None) -> None:
        nodes = _run("scontrol", "-o", "show", "node")
        if nodes.returncode != 0:
            raise LauncherError(
                f"cannot reach Slurm (scontrol show node): {nodes.stderr.strip() or nodes.stdout.strip()}"
            )
        found = parse_node_shards(nodes.stdout)
        if found is not None:
            gpus, shards = found
            self.shards_per_gpu = max(1, shards // max(1, gpus))
            if self.options.shard_mib:
                self.shard_mib = self.options.shard_mib
            elif gpu_mib:
                self.shard_mib = max(1, gpu_mib // self.shards_per_gpu)
            else:
                raise UsageError("the cluster has shards but their size is unknown here: pass --shard-mib N")
        config = _run("scontrol", "show", "config")
        for line in config.stdout.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "AccountingStorageType":
                self.accounting = value.strip() not in ("", "accounting_storage/none")

    # -- submit ----------------------------------------------------------------------------

    def request_for(self, spec: LaunchSpec) -> Request:
        meta = spec.meta
        settings = settings_from_json(meta.get("slurm") or {})
        gpus = int(meta.get("gpus") or 1)
        if gpus > 1 or settings.gpu_type:  # whole GPUs: Slurm 22.05 cannot spread shards over cards
            gres = f"gpu:{settings.gpu_type}:{gpus}" if settings.gpu_type else f"gpu:{gpus}"
        elif self.shard_mib is not None and meta.get("run_alone") and self.shards_per_gpu:
            gres = f"shard:{self.shards_per_gpu}"  # the ladder's last rung: all of one GPU's shards
        elif self.shard_mib is not None:
            gres = f"shard:{shards_for(int(meta.get('predicted_peak_mib') or 0), self.shard_mib, self.shards_per_gpu)}"
        else:
            gres = "gpu:1"
        return Request(
            name=job_name(str(meta.get("suite") or "suite"), spec.job_id, int(meta.get("n") or 0)),
            gres=gres, cpus=settings.cpus, mem_mib=settings.mem_mib,
            partition=settings.partition or self.options.partition,
            account=settings.account or self.options.account, time=settings.time, extra=settings.extra,
            cpus_per_gpu=settings.cpus_per_gpu,
            mem_per_gpu_mib=settings.mem_per_gpu_mib,
            signal_s=warning_s(settings.time) if meta.get("can_resume") else None,
        )

    def submit(self, spec: LaunchSpec) -> LaunchHandle:
        request = self.request_for(spec)
        try:
            spec.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            script = RunDir(spec.run_dir).sbatch_script
            script.write_text(
                sbatch_script(
                    request,
                    str(spec.run_dir),
                    str(spec.cwd or Path.cwd()),
                    wrapper_argv(spec.run_dir, spec.argv, portable=True),
                    spec.env,
                )
            )
        except OSError as exc:
            raise LauncherError(f"cannot write the batch script of job {spec.job_id}: {exc}") from None
        try:
            done = _run(*sbatch_argv(request, str(script)))
        except subprocess.TimeoutExpired:
            # It may have been queued all the same: the next polls adopt it by its unique name,
            # or, absent from the queue past the launch grace, close it lost (never submitted).
            log.warning("sbatch for job %s did not answer within %.0f s; looking for %s in the queue",
                        spec.job_id, COMMAND_TIMEOUT_S, request.name)
            self._backoff("sbatch did not answer")
            self._after_submit()
            return LaunchHandle(executor=self.name, pid=None, executor_id=None)
        job_id = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not job_id.isdigit():
            message = (done.stderr or done.stdout).strip()[:300]
            if is_transient_refusal(message):  # the controller is busy: submitted again later, not counted
                self._backoff(message)
                raise ClusterBusy(f"Slurm is busy, sbatch refused job {spec.job_id} for now: {message}")
            raise LauncherError(f"sbatch refused job {spec.job_id}: {message}")
        self._after_submit()
        return LaunchHandle(executor=self.name, pid=None, executor_id=job_id)

    def _after_submit(self) -> None:
        now = self.clock.monotonic_s()
        self._soon.update(now + delay for delay in SUBMIT_FOLLOW_UPS_S)

    # -- poll ------------------------------------------------------------------------------
    # Slurm is asked on its own period, not every pass: one `squeue --jobs` of our jobs every
    # poll_s (30 s), sooner just after a submission (2, 6, 14 s after it) or when an attempt
    # stopped from outside waits for Slurm's final word; between asks the last answer stands.

    def _backoff(self, why: str) -> None:
        self._failures += 1
        delay = min(BACKOFF_MAX_S, 2.0 ** self._failures)
        self._next_poll_at = self.clock.monotonic_s() + delay
        log.warning("Slurm poll failed (%s); next try in %.0f s, attempts keep their state", why, delay)

    def submit_hold(self) -> str | None:
        """Why nothing is submitted now (Slurm refused or did not answer lately), else None."""
        wait_s = self._next_poll_at - self.clock.monotonic_s()
        if wait_s <= 0:
            return None
        return f"Slurm did not answer lately: next try in {math.ceil(wait_s)} s"

    def expedite(self) -> None:
        """Ask Slurm again soon (not sooner than EXPEDITE_S after the last ask)."""
        self._soon.add(max(self.clock.monotonic_s(), self._polled_at + EXPEDITE_S))

    def _due(self) -> bool:
        now = self.clock.monotonic_s()
        if now >= self._polled_at + self.options.poll_s:
            return True
        soon = [at for at in self._soon if at <= now]
        return bool(soon)

    def _squeue(self, argv: list[str]) -> dict[str, SlurmJob] | None:
        try:
            done = _run("squeue", "-h", "-o", "%i|%j|%T|%r|%m", *argv)
        except (subprocess.TimeoutExpired, OSError) as exc:
            self._backoff(str(exc))
            return None
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:  # every id asked for has left Slurm's memory
                return {}
            self._backoff(done.stderr.strip()[:200])
            return None
        return {k: v for k, v in parse_squeue(done.stdout).items() if v.name.startswith(JOB_NAME_PREFIX)}

    def _finished(self, job_id: str) -> SlurmJob | None:
        """A job no longer in squeue: sacct where accounting exists, else scontrol (which keeps
        ended jobs for MinJobAge); one job asked for by id, never the whole cluster. UNKNOWN
        when Slurm answered and does not know it; None when it did not answer."""
        try:
            if self.accounting:
                done = _run("sacct", "-X", "-n", "-P", "-o", "JobID,JobName,State,Reason,ReqMem", "-j", job_id)
                if done.returncode == 0:
                    return parse_sacct(done.stdout).get(job_id) or SlurmJob(job_id, "", "UNKNOWN", "")
            done = _run("scontrol", "-o", "show", "job", job_id)
        except (subprocess.TimeoutExpired, OSError):
            return None
        if done.returncode != 0:
            return SlurmJob(job_id, "", "UNKNOWN", "") if "Invalid job id" in done.stderr else None
        return parse_scontrol_jobs(done.stdout).get(job_id) or SlurmJob(job_id, "", "UNKNOWN", "")

    def observe(self, attempts: Sequence[tuple[Attempt, Job]]) -> dict[int, RemoteStatus] | None:
        ours = [(a, j) for a, j in attempts if a.executor == self.name]
        self.answered_now = False
        if not ours:
            return {}
        if self.clock.monotonic_s() < self._next_poll_at:
            return None  # backing off after Slurm did not answer: nothing is concluded meanwhile
        if not self._due():
            return {a.id: self._statuses[a.id] for a, _ in ours if a.id in self._statuses}
        statuses = self._ask(ours)
        if statuses is None:
            return None
        self._failures = 0
        self.answered_now = True
        now = self.clock.monotonic_s()
        self._polled_at = now
        self._soon = {at for at in self._soon if at > now}
        self._statuses = statuses
        return dict(statuses)

    def _ask(self, ours: list[tuple[Attempt, Job]]) -> dict[int, RemoteStatus] | None:
        ids = sorted({a.executor_id for a, _ in ours if a.executor_id})
        queue: dict[str, SlurmJob] = {}
        if ids:
            answer = self._squeue([f"--jobs={','.join(ids)}"])
            if answer is None:
                return None
            queue.update(answer)
        unnamed = sorted({job_name(j.suite, a.job_id, a.n) for a, j in ours if not a.executor_id})
        if unnamed:  # submitted, but its id was never recorded: found by its unique name
            answer = self._squeue(["-u", self.user, f"--name={','.join(unnamed)}"])
            if answer is None:
                return None
            queue.update(answer)
        by_name = {job.name: job for job in queue.values()}
        statuses: dict[int, RemoteStatus] = {}
        now = self.clock.monotonic_s()
        lookups = 0
        for attempt, of_job in ours:
            job_id = attempt.executor_id or ""
            job = queue.get(job_id) if job_id else by_name.get(job_name(of_job.suite, attempt.job_id, attempt.n))
            if job is not None:
                self._gone_at.pop(attempt.id, None)
                reason = f"{job.reason}: {STUCK_WORDS}" if never_clears(job.reason) else job.reason
                statuses[attempt.id] = RemoteStatus(job.state, classify_state(job.state).value, reason, job.job_id,
                                                    mem_mib=job.mem_mib)
                continue
            if not job_id:
                continue
            ended = self._ended.get(job_id)
            if ended is None:
                if lookups >= MAX_LOOKUPS:  # many ended at once: the rest at the next ask, soon
                    self.expedite()
                    if attempt.id in self._statuses:
                        statuses[attempt.id] = self._statuses[attempt.id]
                    continue
                lookups += 1
                ended = self._finished(job_id)
                if ended is None:  # Slurm did not answer: nothing is concluded about this one
                    if attempt.id in self._statuses:
                        statuses[attempt.id] = self._statuses[attempt.id]
                    continue
                if ended.state != "UNKNOWN" and classify_state(ended.state).value not in ("queued", "running"):
                    self._ended[job_id] = ended  # a final state never changes: not asked again
            gone_at = self._gone_at.setdefault(attempt.id, now)
            settled = now - gone_at >= self.options.exit_grace_s
            if not settled:  # asked again when the grace is over
                self._soon.add(gone_at + self.options.exit_grace_s)
            statuses[attempt.id] = RemoteStatus(
                ended.state, classify_state(ended.state).value, ended.reason, job_id, settled=settled,
                mem_mib=ended.mem_mib or (last.mem_mib if (last := self._statuses.get(attempt.id)) else None),
            )
        live = {a.id for a, _ in ours}
        self._gone_at = {k: v for k, v in self._gone_at.items() if k in live}
        live_ids = {a.executor_id for a, _ in ours}
        self._ended = {k: v for k, v in self._ended.items() if k in live_ids}
        return statuses

    # -- stop, attach, cleanup -------------------------------------------------------------

    def stop(self, attempt: Attempt, job: Job) -> None:
        job_id = attempt.executor_id or ""
        if job_id:
            argv = ["scancel", job_id]
        else:  # submitted, but its id was never recorded: cancel it by its unique name
            argv = ["scancel", "-u", self.user, "--name", job_name(job.suite, attempt.job_id, attempt.n)]
        try:
            done = _run(*argv)
        except (subprocess.TimeoutExpired, OSError) as exc:
            raise LauncherError(f"scancel did not answer: {exc}") from None
        if done.returncode != 0:
            raise LauncherError(f"scancel {job_id} failed: {done.stderr.strip()[:200]}")

    def attach(self, attempt: Attempt) -> list[str]:
        return attach_argv(attempt, "")  # raises NotAttachable, naming the Slurm job
