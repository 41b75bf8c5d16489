"""Pure Slurm parts: suite `slurm:` settings, the sbatch script, squeue/sacct/scontrol output,
and what a Slurm job state means for an attempt. No processes are run here."""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.rundir_files import RunDir

JOB_NAME_PREFIX = "orch-"
TIME_RE = re.compile(r"^(?:\d+-)?\d{1,3}(?::\d{2}){0,2}$")  # Slurm's --time forms: M, H:M:S, D-H:M:S
MEM_RE = re.compile(r"^(\d{1,9})([KMGT]?)$")
EXTRA_RE = re.compile(r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:/%@+=-]*)?$")
# Options orch sets itself; a suite's extra lines may not change them.
RESERVED_OPTIONS = frozenset({
    "--job-name", "--output", "--error", "--gres", "--gpus", "--mem", "--cpus-per-task", "--chdir",
    "--requeue", "--no-requeue", "--array", "--export", "--partition", "--account", "--parsable",
})
DEFAULT_CPUS = 1
DEFAULT_MEM_MIB = 2048


@dataclass(frozen=True)
class SlurmSettings:
    """A suite's `slurm:` block."""

    time: str | None = None  # --time
    cpus: int = DEFAULT_CPUS  # --cpus-per-task
    mem_mib: int = DEFAULT_MEM_MIB  # --mem, host memory
    extra: tuple[str, ...] = ()  # further `#SBATCH` options, e.g. "--qos=short"

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "cpus": self.cpus, "mem_mib": self.mem_mib, "extra": list(self.extra)}


def _mem_mib(text: str) -> int:
    match = MEM_RE.fullmatch(text.strip().upper())
    if match is None:
        raise ValueError(text)
    factor = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2)]
    return max(1, math.ceil(int(match.group(1)) * factor))


def parse_settings(raw: Any, where: str) -> SlurmSettings:
    """A suite's `slurm:` mapping -> SlurmSettings; anything invalid is a UsageError naming it."""
    if raw is None:
        return SlurmSettings()
    if not isinstance(raw, Mapping):
        raise UsageError(f"{where}: `slurm` must be a mapping (time, cpus, mem, extra)")
    unknown = sorted(str(k) for k in set(raw) - {"time", "cpus", "mem", "extra"})
    if unknown:
        raise UsageError(f"{where}: `slurm` has unknown key(s) {', '.join(unknown)} (known: time, cpus, mem, extra)")
    time = raw.get("time")
    if time is not None:
        time = str(time)
        if not TIME_RE.fullmatch(time):
            raise UsageError(f"{where}: slurm time {time!r} is not a Slurm time limit (MINUTES, H:MM:SS or D-H:MM:SS)")
    cpus = raw.get("cpus", DEFAULT_CPUS)
    if isinstance(cpus, bool) or not isinstance(cpus, int) or not 1 <= cpus <= 1024:
        raise UsageError(f"{where}: slurm cpus {cpus!r} must be an integer from 1 to 1024")
    mem = raw.get("mem", f"{DEFAULT_MEM_MIB}M")
    try:
        mem_mib = _mem_mib(str(mem))
    except ValueError:
        raise UsageError(f"{where}: slurm mem {mem!r} is not a size such as 4G or 4096M") from None
    extra_raw = raw.get("extra", [])
    if not isinstance(extra_raw, list) or not all(isinstance(x, str) for x in extra_raw):
        raise UsageError(f"{where}: slurm extra must be a list of sbatch options such as '--qos=short'")
    for option in extra_raw:
        if not EXTRA_RE.fullmatch(option):
            raise UsageError(f"{where}: slurm extra option {option!r} is not of the form --name or --name=value")
        if option.split("=", 1)[0] in RESERVED_OPTIONS:
            raise UsageError(f"{where}: slurm extra option {option!r} is set by orch itself")
    return SlurmSettings(time=time, cpus=cpus, mem_mib=mem_mib, extra=tuple(extra_raw))


def settings_from_json(data: Mapping[str, Any]) -> SlurmSettings:
    if not data:
        return SlurmSettings()
    return SlurmSettings(
        time=data.get("time"), cpus=int(data.get("cpus") or DEFAULT_CPUS),
        mem_mib=int(data.get("mem_mib") or DEFAULT_MEM_MIB), extra=tuple(data.get("extra") or ()),
    )


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
    gres: str  # "shard:3" or "gpu:1"
    cpus: int
    mem_mib: int
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    extra: tuple[str, ...] = ()


# Variables Slurm itself sets for the allocation: never carried over from the daemon.
SLURM_OWNS = ("CUDA_VISIBLE_DEVICES", "ORCH_GPU_UUID", "ORCH_GPU_INDEX")


def sbatch_script(request: Request, run_dir: str, cwd: str, argv: list[str], env: Mapping[str, str]) -> str:
    """The batch script: `#SBATCH` lines, the attempt's environment, then `exec` of the wrapper,
    so scancel's SIGTERM reaches the wrapper, which forwards it and writes exit.json."""
    lines = [
        "#!/bin/sh",
        f"#SBATCH --job-name={request.name}",
        f"#SBATCH --output={run_dir}/{RunDir.SLURM_OUTPUT}",
        f"#SBATCH --gres={request.gres}",
        f"#SBATCH --cpus-per-task={request.cpus}",
        f"#SBATCH --mem={request.mem_mib}M",
        "#SBATCH --no-requeue",  # orch's own ladder resubmits, as a new job
        f"#SBATCH --chdir={cwd}",
    ]
    if request.partition:
        lines.append(f"#SBATCH --partition={request.partition}")
    if request.account:
        lines.append(f"#SBATCH --account={request.account}")
    if request.time:
        lines.append(f"#SBATCH --time={request.time}")
    lines += [f"#SBATCH {option}" for option in request.extra]
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
    FAILED = "failed"  # Slurm ended it for a reason rerunning would not fix


QUEUED_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"})
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "STOPPED", "RESIZING"})
LOST_STATES = frozenset({"NODE_FAIL", "PREEMPTED", "BOOT_FAIL"})
FAILED_STATES = frozenset({"TIMEOUT", "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT"})


def classify_state(state: str) -> SlurmState:
    base = state.split()[0].rstrip("+").upper() if state.strip() else ""
    if base in QUEUED_STATES:
        return SlurmState.QUEUED
    if base in RUNNING_STATES:
        return SlurmState.RUNNING
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


def parse_squeue(text: str) -> dict[str, SlurmJob]:
    """`squeue -h -o %i|%j|%T|%r` -> jobs by id; malformed lines are skipped."""
    jobs: dict[str, SlurmJob] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        jobs[parts[0]] = SlurmJob(parts[0], parts[1], parts[2].upper(), parts[3])
    return jobs


def parse_sacct(text: str) -> dict[str, SlurmJob]:
    """`sacct -X -n -P -o JobID,JobName,State,Reason` -> jobs by id (the last row of each wins)."""
    jobs: dict[str, SlurmJob] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        jobs[parts[0]] = SlurmJob(parts[0], parts[1], parts[2].split()[0].upper(), parts[3] if len(parts) > 3 else "")
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
            jobs[job_id] = SlurmJob(job_id, fields.get("JobName", ""), fields.get("JobState", "").upper(), fields.get("Reason", ""))
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
