"""A job's resources beyond GPU memory: how many GPUs (a gang) and CPU cores. Pure.

`gpus:` and `cpus:` may be set in the suite (the default for its configs) or in a config (or by
`--set gpus=2`), the config winning. Both are whole numbers: gpus 1..64 (default 1), cpus
1..1024 (default: not counted). A config's `host_mem_gib` (host RAM of the job's whole process
tree, used until a finished attempt of its shape has measured it) is checked here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.errors import PlanError

MAX_GPUS = 64
MAX_CPUS = 1024


def parse_count(value: Any, key: str, where: str, maximum: int) -> int:
    """A positive whole number of at most `maximum`, or a PlanError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise PlanError(f"{where}: `{key}` must be a whole number from 1 to {maximum}, got {value!r}")
    return value


def job_resources(
    config: Mapping[str, Any], suite_gpus: int, suite_cpus: int | None, where: str
) -> tuple[int, int | None]:
    """(gpus, cpus) of one job: the config's values, else the suite's."""
    host = config.get("host_mem_gib")
    if host is not None and (isinstance(host, bool) or not isinstance(host, (int, float)) or not 0 < host <= 65536):
        raise PlanError(f"{where}: `host_mem_gib` must be a number of GiB between 0 and 65536, got {host!r}")
    gpus = parse_count(config["gpus"], "gpus", where, MAX_GPUS) if config.get("gpus") is not None else suite_gpus
    cpus = parse_count(config["cpus"], "cpus", where, MAX_CPUS) if config.get("cpus") is not None else suite_cpus
    return gpus, cpus


def check_gangs_fit(gpus_needed: Mapping[str, int], usable_gpus: list[int], where: str) -> None:
    """Refuse a job needing more GPUs than it may ever use (`gpus_needed`: config name -> gpus):
    a gang is never placed in part, so it would wait forever. `usable_gpus`: the GPUs the jobs
    may run on (`--gpus`, else the machine's); `where` says where they come from."""
    too_big = {name: n for name, n in gpus_needed.items() if n > len(usable_gpus)}
    if not too_big:
        return
    name, needed = max(too_big.items(), key=lambda item: item[1])
    others = f" (and {len(too_big) - 1} other config(s))" if len(too_big) > 1 else ""
    shown = " ".join(map(str, usable_gpus)) or "none"
    raise PlanError(
        f"config {name}{others} needs gpus: {needed}, but {where} {len(usable_gpus)} GPU(s) ({shown}): "
        f"it would wait forever; give it at least {needed} GPUs or --set gpus={len(usable_gpus) or 1}"
    )
