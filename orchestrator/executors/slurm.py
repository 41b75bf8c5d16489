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
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.clock import SYSTEM_CLOCK, Clock
from orchestrator.errors import LauncherError, UsageError
from orchestrator.executors.base import RemoteStatus, attach_argv, log_path
from orchestrator.executors.slurm_parse import (
    JOB_NAME_PREFIX,
    Request,
    SlurmJob,
    classify_state,
    job_name,
    parse_node_shards,
    parse_sacct,
    parse_scontrol_jobs,
    parse_squeue,
    sbatch_script,
    settings_from_json,
    shards_for,
)
from orchestrator.launch.base import LaunchHandle, LaunchSpec
from orchestrator.launch.wrapper import wrapper_argv
from orchestrator.rundir_files import RunDir
from orchestrator.store.rows import Attempt, Job

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 20.0
BACKOFF_MAX_S = 60.0


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    shard_mib: int | None = None  # MiB one shard stands for; None: derived from the node and GPU size
    max_in_queue: int = 16  # attempts orch keeps submitted (pending + running) at once


def _run(*argv: str, timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)


class SlurmExecutor:
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
        self._discover(gpu_mib)

    def _discover(self, gpu_mib: int | None) -> None:
        nodes = _run("scontrol", "-o", "show", "node")
        if nodes.returncode != 0:
            raise LauncherError(f"cannot reach Slurm (scontrol show node): {nodes.stderr.strip() or nodes.stdout.strip()}")
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
        if self.shard_mib is not None and meta.get("run_alone") and self.shards_per_gpu:
            gres = f"shard:{self.shards_per_gpu}"  # the ladder's last rung: all of one GPU's shards
        elif self.shard_mib is not None:
            gres = f"shard:{shards_for(int(meta.get('predicted_peak_mib') or 0), self.shard_mib, self.shards_per_gpu)}"
        else:
            gres = "gpu:1"
        return Request(
            name=job_name(str(meta.get("suite") or "suite"), spec.job_id, int(meta.get("n") or 0)),
            gres=gres, cpus=settings.cpus, mem_mib=settings.mem_mib,
            partition=self.options.partition, account=self.options.account, time=settings.time,
            extra=settings.extra,
        )

    def launch(self, spec: LaunchSpec) -> LaunchHandle:
        request = self.request_for(spec)
        try:
            spec.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            script = RunDir(spec.run_dir).sbatch_script
            script.write_text(sbatch_script(
                request, str(spec.run_dir), str(spec.cwd or Path.cwd()), wrapper_argv(spec.run_dir, spec.argv, portable=True), spec.env,
            ))
        except OSError as exc:
            raise LauncherError(f"cannot write the batch script of job {spec.job_id}: {exc}") from None
        try:
            done = _run("sbatch", "--parsable", str(script))
        except subprocess.TimeoutExpired:
            # It may have been queued all the same: the next polls adopt it by its unique name,
            # or, absent from the queue past the launch grace, close it lost (never submitted).
            log.warning("sbatch for job %s did not answer within %.0f s; looking for %s in the queue",
                        spec.job_id, COMMAND_TIMEOUT_S, request.name)
            return LaunchHandle(launcher=self.name, pid=None, window_id=None, executor_id=None)
        job_id = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not job_id.isdigit():
            raise LauncherError(f"sbatch refused job {spec.job_id}: {(done.stderr or done.stdout).strip()[:300]}")
        return LaunchHandle(launcher=self.name, pid=None, window_id=None, executor_id=job_id)

    # -- poll ------------------------------------------------------------------------------

    def _backoff(self, why: str) -> None:
        self._failures += 1
        delay = min(BACKOFF_MAX_S, 2.0 ** self._failures)
        self._next_poll_at = self.clock.monotonic_s() + delay
        log.warning("Slurm poll failed (%s); next try in %.0f s, attempts keep their state", why, delay)

    def _squeue(self) -> dict[str, SlurmJob] | None:
        try:
            done = _run("squeue", "-h", "-u", self.user, "-o", "%i|%j|%T|%r")
        except (subprocess.TimeoutExpired, OSError) as exc:
            self._backoff(str(exc))
            return None
        if done.returncode != 0:
            self._backoff(done.stderr.strip()[:200])
            return None
        return {k: v for k, v in parse_squeue(done.stdout).items() if v.name.startswith(JOB_NAME_PREFIX)}

    def _finished(self, job_ids: list[str]) -> dict[str, SlurmJob]:
        """Jobs no longer in squeue: sacct where accounting exists, else scontrol (which keeps
        ended jobs for MinJobAge). Unknown ids are left out."""
        try:
            if self.accounting:
                done = _run("sacct", "-X", "-n", "-P", "-o", "JobID,JobName,State,Reason", "-j", ",".join(job_ids))
                if done.returncode == 0:
                    return parse_sacct(done.stdout)
            done = _run("scontrol", "-o", "show", "job")
        except (subprocess.TimeoutExpired, OSError):
            return {}
        return parse_scontrol_jobs(done.stdout) if done.returncode == 0 else {}

    def poll(self, attempts: Sequence[tuple[Attempt, Job]]) -> dict[int, RemoteStatus] | None:
        ours = [(a, j) for a, j in attempts if a.executor == self.name or a.launcher == self.name]
        if not ours:
            return {}
        if self.clock.monotonic_s() < self._next_poll_at:
            return None
        queue = self._squeue()
        if queue is None:
            return None
        self._failures = 0
        by_name = {job.name: job for job in queue.values()}
        statuses: dict[int, RemoteStatus] = {}
        gone: dict[int, str] = {}
        for attempt, of_job in ours:
            job_id = attempt.executor_id or ""
            job = queue.get(job_id) if job_id else by_name.get(job_name(of_job.suite, attempt.job_id, attempt.n))
            if job is not None:
                statuses[attempt.id] = RemoteStatus(job.state, classify_state(job.state).value, job.reason, job.job_id)
            elif job_id:
                gone[attempt.id] = job_id
        if gone:
            ended = self._finished(sorted(set(gone.values())))
            for attempt_id, job_id in gone.items():
                job = ended.get(job_id)
                state = job.state if job is not None else "UNKNOWN"
                kind = classify_state(state).value if job is not None else "ended"
                statuses[attempt_id] = RemoteStatus(state, kind, job.reason if job else "", job_id)
        return statuses

    # -- stop, attach, cleanup -------------------------------------------------------------

    def cancel(self, attempt: Attempt, job: Job) -> None:
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

    def cleanup(self, attempts: Sequence[Attempt]) -> None:
        """Nothing stays open on a login node: Slurm's own output file is in the run dir."""

    def logs(self, attempt: Attempt) -> Path:
        return log_path(attempt)  # the wrapper writes it on the shared filesystem

    def attach(self, attempt: Attempt) -> list[str]:
        return attach_argv(attempt, "")  # raises NotAttachable, naming the Slurm job

    def window_alive(self, handle_window_id: str) -> bool:
        return False

    def kill_window(self, window_id: str) -> None:
        return None

    def attach_command(self, window_id: str) -> list[str]:
        return []
