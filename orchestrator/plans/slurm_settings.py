"""A suite's `slurm:` block: checked at submit, kept with each job as JSON. Pure.

```yaml
slurm:
  partition: gpu          # --partition (else the daemon's --partition, else the cluster's default)
  account: mylab          # --account
  time: "4:00:00"         # --time: MINUTES, H:MM:SS or D-H:MM:SS
  gpu_type: a100          # --gres=gpu:a100:N (whole GPUs of that type, no shards)
  cpus: 4                 # --cpus-per-task (default 1), or
  cpus_per_gpu: 8         # --cpus-per-gpu
  mem: 32G                # --mem (default: none, the cluster's own default holds), or
  mem_per_gpu: 40G        # --mem-per-gpu
  max_timeouts: 3         # time limits a resumable worker may reach before its job fails
  extra: ["--constraint=a100|h100", "--exclude=n[1-3]"]   # passed to sbatch as arguments
```
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import UsageError

TIME_RE = re.compile(r"^(?:\d+-)?\d{1,3}(?::\d{2}){0,2}$")  # Slurm's --time forms: M, H:M:S, D-H:M:S
MEM_RE = re.compile(r"^(\d{1,9})([KMGT]?)$")
NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")  # partition, account, GPU type
# An extra option reaches sbatch as one argument, never through a shell: `|`, `[ ]`, `&`, `,`
# are Slurm's own syntax (--constraint=a100|h100, --exclude=n[1-3]); only control characters
# and spaces are refused.
EXTRA_RE = re.compile(r"^--[a-z][a-z0-9-]*(=[\x21-\x7e]{0,200})?$")
# Options orch sets itself (or from this block's own keys); extra may not change them.
RESERVED_OPTIONS = frozenset({
    "--job-name", "--output", "--error", "--gres", "--gpus", "--gpus-per-node", "--gpus-per-task",
    "--mem", "--mem-per-gpu", "--mem-per-cpu", "--cpus-per-task", "--cpus-per-gpu", "--chdir",
    "--requeue", "--no-requeue", "--array", "--export", "--partition", "--account", "--parsable",
    "--time", "--signal", "--wrap",
})
KEYS = (
    "partition",
    "account",
    "time",
    "gpu_type",
    "cpus",
    "cpus_per_gpu",
    "mem",
    "mem_per_gpu",
    "max_timeouts",
    "extra",
)
DEFAULT_CPUS = 1
DEFAULT_MAX_TIMEOUTS = 3


@dataclass(frozen=True)
class SlurmSettings:
    """A suite's `slurm:` block."""

    time: str | None = None  # --time
    cpus: int | None = DEFAULT_CPUS  # --cpus-per-task; None when cpus_per_gpu is given
    mem_mib: int | None = None  # --mem, host memory; None: the cluster's default
    extra: tuple[str, ...] = ()  # further sbatch options, e.g. "--qos=short"
    partition: str | None = None
    account: str | None = None
    gpu_type: str | None = None  # gres type: --gres=gpu:TYPE:N
    cpus_per_gpu: int | None = None
    mem_per_gpu_mib: int | None = None
    max_timeouts: int = DEFAULT_MAX_TIMEOUTS

    def to_json(self) -> dict[str, Any]:
        """What is stored with each job: the keys set, and time/cpus/mem_mib/extra always."""
        full = {
            "time": self.time, "cpus": self.cpus, "mem_mib": self.mem_mib, "extra": list(self.extra),
            "partition": self.partition, "account": self.account, "gpu_type": self.gpu_type,
            "cpus_per_gpu": self.cpus_per_gpu, "mem_per_gpu_mib": self.mem_per_gpu_mib,
            "max_timeouts": self.max_timeouts if self.max_timeouts != DEFAULT_MAX_TIMEOUTS else None,
        }
        return {k: v for k, v in full.items() if v is not None or k in ("time", "cpus", "mem_mib")}


def mem_mib_of(text: str) -> int:
    match = MEM_RE.fullmatch(text.strip().upper())
    if match is None:
        raise ValueError(text)
    factor = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2)]
    return max(1, math.ceil(int(match.group(1)) * factor))


def _int(raw: Mapping[str, Any], key: str, where: str, low: int, high: int) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError(f"{where}: slurm {key} {value!r} must be an integer from {low} to {high}")
    return value


def _mem(raw: Mapping[str, Any], key: str, where: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    try:
        return mem_mib_of(str(value))
    except ValueError:
        raise UsageError(f"{where}: slurm {key} {value!r} is not a size such as 4G or 4096M") from None


def _name(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise UsageError(f"{where}: slurm {key} {value!r} must be a name of letters, digits and _.+-")
    return value


def parse_settings(raw: Any, where: str) -> SlurmSettings:
    """A suite's `slurm:` mapping -> SlurmSettings; anything invalid is a UsageError naming it."""
    if raw is None:
        return SlurmSettings()
    if not isinstance(raw, Mapping):
        raise UsageError(f"{where}: `slurm` must be a mapping ({', '.join(KEYS)})")
    unknown = sorted(str(k) for k in set(raw) - set(KEYS))
    if unknown:
        raise UsageError(f"{where}: `slurm` has unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
    time = raw.get("time")
    if time is not None:
        time = str(time)
        if not TIME_RE.fullmatch(time):
            raise UsageError(f"{where}: slurm time {time!r} is not a Slurm time limit (MINUTES, H:MM:SS or D-H:MM:SS)")
    if raw.get("cpus") is not None and raw.get("cpus_per_gpu") is not None:
        raise UsageError(f"{where}: slurm cpus and cpus_per_gpu exclude each other (Slurm takes one): keep one")
    if raw.get("mem") is not None and raw.get("mem_per_gpu") is not None:
        raise UsageError(f"{where}: slurm mem and mem_per_gpu exclude each other (Slurm takes one): keep one")
    cpus_per_gpu = _int(raw, "cpus_per_gpu", where, 1, 1024)
    cpus = _int(raw, "cpus", where, 1, 1024)
    max_timeouts = _int(raw, "max_timeouts", where, 0, 100)
    extra_raw = raw.get("extra", [])
    if not isinstance(extra_raw, list) or not all(isinstance(x, str) for x in extra_raw):
        raise UsageError(f"{where}: slurm extra must be a list of sbatch options such as '--qos=short'")
    for option in extra_raw:
        if not EXTRA_RE.fullmatch(option):
            raise UsageError(
                f"{where}: slurm extra option {option!r} is not of the form --name or --name=value (no spaces)"
            )
        if option.split("=", 1)[0] in RESERVED_OPTIONS:
            raise UsageError(f"{where}: slurm extra option {option!r} is set by orch itself (or by a key of `slurm:`)")
    return SlurmSettings(
        time=time, cpus=None if cpus_per_gpu is not None else (cpus or DEFAULT_CPUS),
        mem_mib=_mem(raw, "mem", where), extra=tuple(extra_raw),
        partition=_name(raw, "partition", where), account=_name(raw, "account", where),
        gpu_type=_name(raw, "gpu_type", where), cpus_per_gpu=cpus_per_gpu,
        mem_per_gpu_mib=_mem(raw, "mem_per_gpu", where),
        max_timeouts=DEFAULT_MAX_TIMEOUTS if max_timeouts is None else max_timeouts,
    )


def settings_from_json(data: Mapping[str, Any]) -> SlurmSettings:
    """A job's stored settings (written by to_json, possibly by an older orch)."""
    if not data:
        return SlurmSettings()

    def opt_int(key: str) -> int | None:
        value = data.get(key)
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    def opt_str(key: str) -> str | None:
        value = data.get(key)
        return value if isinstance(value, str) and value else None

    max_timeouts = opt_int("max_timeouts")
    cpus_per_gpu = opt_int("cpus_per_gpu")
    return SlurmSettings(
        time=opt_str("time"), cpus=None if cpus_per_gpu else (opt_int("cpus") or DEFAULT_CPUS),
        mem_mib=opt_int("mem_mib"), extra=tuple(str(x) for x in data.get("extra") or ()),
        partition=opt_str("partition"), account=opt_str("account"), gpu_type=opt_str("gpu_type"),
        cpus_per_gpu=cpus_per_gpu, mem_per_gpu_mib=opt_int("mem_per_gpu_mib"),
        max_timeouts=DEFAULT_MAX_TIMEOUTS if max_timeouts is None else max_timeouts,
    )


def time_limit_s(time: str | None) -> int | None:
    """Slurm's --time forms in seconds: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    if not time:
        return None
    days, _, rest = time.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        hours, minutes, seconds = ([*parts, 0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]
