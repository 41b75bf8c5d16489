"""Pure Slurm parts: the sbatch script, squeue/sacct/scontrol output,
and what a Slurm job state means for an attempt. No processes are run here."""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from orchestrator.plans.slurm_settings import (
    SlurmSettings,
    parse_settings,
    settings_from_json,
    time_limit_s,
)
from orchestrator.rundir_files import RunDir

JOB_NAME_PREFIX = "orch-"
__all__ = ["SlurmSettings", "parse_settings", "settings_from_json", "time_limit_s"]  # kept importable from here


# What a busy or restarting controller answers: the submission is worth making again later.
TRANSIENT_REFUSALS = (
    "Socket timed out", "Resource temporarily unavailable", "Unable to contact slurm controller",
    "slurm_receive_msg", "Zero Bytes were transmitted", "Slurm temporarily unable to accept job",
)


def is_transient_refusal(message: str) -> bool:
    return any(marker.lower() in message.lower() for marker in TRANSIENT_REFUSALS)


def job_name(suite: str, job_id: int, attempt_n: int) -> str:
    safe_suite = re.sub(r"[^A-Za-z0-9_.-]+", "_", suite)[:60]
    return f"{JOB_NAME_PREFIX}{safe_suite}-{job_id}-a{attempt_n}"


def shards_for(predicted_mib: int, shard_mib: int, shards_per_gpu: int | None) -> int:
    """k = ceil(predicted / shard size), at least 1 and (Slurm 22.05 cannot split a shard
    request over GPUs) at most one GPU's shards."""
    k = max(1, math.ceil(max(0, predicted_mib) / max(1, shard_mib)))
    return min(k, shards_per_gpu) if shards_per_gpu else k


@dataclass(frozen=True)
class Request:
    name: str
    gres: str  # "shard:3", "gpu:1", "gpu:a100:2"
    cpus: int | None  # --cpus-per-task; None: --cpus-per-gpu, or the cluster's default
    mem_mib: int | None  # --mem; None: --mem-per-gpu, or the cluster's default
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    extra: tuple[str, ...] = ()  # passed to sbatch as arguments, never written into the script
    cpus_per_gpu: int | None = None
    mem_per_gpu_mib: int | None = None
    signal_s: int | None = None  # --signal=B:USR2@N: a warning N s before the time limit


# Variables Slurm itself sets for the allocation: never carried over from the daemon.
SLURM_OWNS = ("CUDA_VISIBLE_DEVICES", "ORCH_GPU_UUID", "ORCH_GPU_INDEX")
WARNING_S = 120  # how long before the time limit a resumable worker is warned (SIGUSR2)


def warning_s(time: str | None) -> int:
    """Seconds before the limit for --signal: 120, or half of a shorter limit (at least 10;
    Slurm may send it up to a minute early)."""
    limit = time_limit_s(time)
    return WARNING_S if limit is None else max(10, min(WARNING_S, limit // 2))


def sbatch_argv(request: Request, script: str) -> list[str]:
    """sbatch's command line: the suite's extra options as arguments (no shell ever parses
    them, so `--constraint=a100|h100` and `--exclude=n[1-3]` arrive as written)."""
    return ["sbatch", "--parsable", *request.extra, script]


def sbatch_script(request: Request, run_dir: str, cwd: str, argv: list[str], env: Mapping[str, str]) -> str:
    """The batch script: `#SBATCH` lines, the attempt's environment, then `exec` of the wrapper,
    so scancel's SIGTERM reaches the wrapper, which forwards it and writes exit.json."""
    lines = [
        "#!/bin/sh",
        f"#SBATCH --job-name={request.name}",
        f"#SBATCH --output={run_dir}/{RunDir.SLURM_OUTPUT}",
        f"#SBATCH --gres={request.gres}",
    ]
    if request.cpus is not None:
        lines.append(f"#SBATCH --cpus-per-task={request.cpus}")
    if request.cpus_per_gpu is not None:
        lines.append(f"#SBATCH --cpus-per-gpu={request.cpus_per_gpu}")
    if request.mem_mib is not None:
        lines.append(f"#SBATCH --mem={request.mem_mib}M")
    if request.mem_per_gpu_mib is not None:
        lines.append(f"#SBATCH --mem-per-gpu={request.mem_per_gpu_mib}M")
    lines += [
        "#SBATCH --no-requeue",  # orch's own ladder resubmits, as a new job
        f"#SBATCH --chdir={cwd}",
    ]
    if request.partition:
        lines.append(f"#SBATCH --partition={request.partition}")
    if request.account:
        lines.append(f"#SBATCH --account={request.account}")
    if request.time:
        lines.append(f"#SBATCH --time={request.time}")
    if request.signal_s is not None:
        lines.append(f"#SBATCH --signal=B:USR2@{request.signal_s}")
    if request.extra:
        lines.append("# submitted with: " + shlex.join(sbatch_argv(request, "sbatch.sh")))
    lines.append("# the attempt's environment (Slurm sets CUDA_VISIBLE_DEVICES for the allocation)")
    for key in sorted(env):
        if key not in SLURM_OWNS:
            lines.append(f"export {key}={shlex.quote(env[key])}")
    lines.append('export ORCH_SLURM_JOB_ID="$SLURM_JOB_ID"')
    lines.append("exec " + shlex.join(argv))
    return "\n".join(lines) + "\n"


class SlurmState(str, Enum):
    """What a Slurm job state means for orch's attempt."""

    QUEUED = "queued"  # waiting in Slurm's queue
    RUNNING = "running"
    ENDED = "ended"  # ended normally or by the worker: the run dir says how
    LOST = "lost"  # the node or Slurm ended it: requeue unchanged
    PREEMPTED = "preempted"  # a higher-priority job took its place: requeued, never counted
    TIMEOUT = "timeout"  # its time limit: failed, or resumed where the worker can resume
    HOST_OOM = "host_oom"  # its --mem (the cgroup's limit): retried with more host memory
    FAILED = "failed"  # Slurm ended it for a reason rerunning would not fix


QUEUED_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
        "SUSPENDED",
    }
)
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "STOPPED", "RESIZING"})
LOST_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})
FAILED_STATES = frozenset({"DEADLINE", "REVOKED", "SPECIAL_EXIT"})
OWN_WORD = {"PREEMPTED": SlurmState.PREEMPTED, "TIMEOUT": SlurmState.TIMEOUT, "OUT_OF_MEMORY": SlurmState.HOST_OOM}


# Pending reasons that no other job's end will clear: the job never starts as submitted.
NEVER_CLEARS = frozenset({
    "PartitionTimeLimit", "PartitionNodeLimit", "PartitionConfig", "InvalidAccount", "InvalidQOS",
    "AccountNotAllowed", "QOSNotAllowed", "BadConstraints", "DependencyNeverSatisfied",
})
STUCK_WORDS = "never starts as submitted"  # shown after the reason; the slot it held is freed


def never_clears(reason: str) -> bool:
    """PartitionTimeLimit, InvalidAccount, a QOS or association limit per job (QOSMaxWallDurationPerJobLimit,
    QOSMaxGRESPerJob, AssocMaxCpuPerJobLimit, ...): waiting will not start it."""
    word = reason.strip()
    per_job = word.startswith(("QOSMax", "QOSMin", "AssocMax", "AssocGrp")) and "PerJob" in word
    return word in NEVER_CLEARS or per_job


def classify_state(state: str) -> SlurmState:
    base = state.split()[0].rstrip("+").upper() if state.strip() else ""
    if base in QUEUED_STATES:
        return SlurmState.QUEUED
    if base in RUNNING_STATES:
        return SlurmState.RUNNING
    if base in OWN_WORD:
        return OWN_WORD[base]
    if base in LOST_STATES:
        return SlurmState.LOST
    if base in FAILED_STATES:
        return SlurmState.FAILED
    return SlurmState.ENDED  # COMPLETED, FAILED, CANCELLED: the wrapper's exit.json tells


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    name: str
    state: str  # Slurm's own word, e.g. PENDING, NODE_FAIL
    reason: str  # pending reason (Resources, Priority, ...) or "None"
    mem_mib: int | None = None  # the host memory Slurm gave it (per node), where it says


def slurm_mem_mib(text: str) -> int | None:
    """Slurm's memory words (`256M`, `4G`, `2000Mn`, `16Gc`) in MiB; None when unreadable or 0."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)[nc]?", text.strip())
    if match is None:
        return None
    factor = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2)]
    mib = math.ceil(float(match.group(1)) * factor)
    return mib or None


def parse_squeue(text: str) -> dict[str, SlurmJob]:
    """`squeue -h -o %i|%j|%T|%r|%m` -> jobs by id; malformed lines are skipped."""
    jobs: dict[str, SlurmJob] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) not in (4, 5) or not parts[0].isdigit():
            continue
        mem = slurm_mem_mib(parts[4]) if len(parts) == 5 else None
        jobs[parts[0]] = SlurmJob(parts[0], parts[1], parts[2].upper(), parts[3], mem)
    return jobs


def parse_sacct(text: str) -> dict[str, SlurmJob]:
    """`sacct -X -n -P -o JobID,JobName,State,Reason,ReqMem` -> jobs by id (the last row of each wins)."""
    jobs: dict[str, SlurmJob] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0].isdigit() or not parts[2].strip():
            continue
        mem = slurm_mem_mib(parts[4]) if len(parts) > 4 else None
        jobs[parts[0]] = SlurmJob(
            parts[0], parts[1], parts[2].split()[0].upper(), parts[3] if len(parts) > 3 else "", mem
        )
    return jobs


def parse_scontrol_jobs(text: str) -> dict[str, SlurmJob]:
    """`scontrol -o show job` (one line per job, KEY=VALUE words) -> jobs by id."""
    jobs: dict[str, SlurmJob] = {}
    for line in text.splitlines():
        fields: dict[str, str] = {}
        for word in line.split():
            key, sep, value = word.partition("=")
            if sep and key not in fields:
                fields[key] = value
        job_id = fields.get("JobId", "")
        if job_id.isdigit():
            jobs[job_id] = SlurmJob(
                job_id,
                fields.get("JobName", ""),
                fields.get("JobState", "").upper(),
                fields.get("Reason", ""),
                slurm_mem_mib(fields.get("MinMemoryNode", "")),
            )
    return jobs


def parse_node_shards(text: str) -> tuple[int, int] | None:
    """`scontrol -o show node` -> (gpus, shards) of the first node with shards, else None."""
    for line in text.splitlines():
        match = re.search(r"\bGres=(\S+)", line)
        if not match:
            continue
        gpus = shards = 0
        for item in match.group(1).split(","):
            bits = item.split("(")[0].split(":")
            if bits[0] == "gpu" and bits[-1].isdigit():
                gpus += int(bits[-1])
            elif bits[0] == "shard" and bits[-1].isdigit():
                shards += int(bits[-1])
        if shards:
            return gpus, shards
    return None
