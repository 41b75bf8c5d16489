"""Sweep traces: a machine, a GPU plan and jobs with their true memory and run time per ladder level."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

MIB_PER_GIB = 1024
LEVELS = 5  # ladder levels 0..4; level 4 runs alone on a GPU
RUN_ALONE_LEVEL = LEVELS - 1


@dataclass(frozen=True)
class TraceGpu:
    index: int
    total_mib: float
    foreign_mib: float  # other people's processes, held for the whole trace

    @property
    def usable_mib(self) -> float:
        return self.total_mib - self.foreign_mib


@dataclass(frozen=True)
class TraceJob:
    id: str
    config: str
    task: str
    seed: int
    declared_mib: float  # what the suite says before anything has run
    peak_mib: tuple[float, ...]  # true peak per ladder level, hidden from the policies
    minutes: tuple[float, ...]  # run time per level when alone on a card
    ramp_s: float  # memory rises linearly to the peak over this long
    # a late OOM (an evaluation's spike): an attempt at a level below `late_oom_levels` dies at
    # this fraction of its work, whatever its neighbours; 0: none
    late_oom_at: float = 0.0
    late_oom_levels: int = 1
    # launch to the first training step (imports, model load, tokenising): no work done, little
    # memory held (`startup_mib`), no share of the card's compute taken; the ramp follows it
    startup_s: float = 0.0
    startup_mib: float = 0.0

    def shape(self, level: int) -> tuple[str, str, int]:
        return (self.config, self.task, level)


@dataclass(frozen=True)
class Trace:
    gpus: tuple[TraceGpu, ...]
    plan: tuple[int, ...]  # slots per GPU, in the order of `gpus`
    jobs: tuple[TraceJob, ...]
    # T(k), the card's total throughput with k jobs in solo-job units, measured for these jobs;
    # None: the simulator's default table
    sharing: tuple[float, ...] | None = None

    def slots(self, gpu_index: int) -> int:
        position = [g.index for g in self.gpus].index(gpu_index)
        return self.plan[position]


def parse_plan(text: str | int, n_gpus: int) -> tuple[int, ...]:
    """`"2,2,1"` or a single integer broadcast to every GPU."""
    parts = [int(p) for p in str(text).replace(" ", ",").split(",") if p]
    if len(parts) == 1:
        return tuple(parts * n_gpus)
    if len(parts) != n_gpus:
        raise ValueError(f"plan {text!r} has {len(parts)} entries for {n_gpus} GPUs")
    return tuple(parts)


def load_trace(path: Path | str) -> Trace:
    with open(path) as f:
        # libyaml's loader where PyYAML has it: a 10,000-job trace loads in a second, not ten
        raw = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    gpus = tuple(
        TraceGpu(
            int(g["index"]), g["total_gib"] * MIB_PER_GIB, g.get("foreign_gib", 0.0) * MIB_PER_GIB
        )
        for g in raw["machine"]["gpus"]
    )
    jobs = tuple(
        TraceJob(
            id=str(j["id"]),
            config=str(j["config"]),
            task=str(j["task"]),
            seed=int(j["seed"]),
            declared_mib=j["declared_gib"] * MIB_PER_GIB,
            peak_mib=tuple(p * MIB_PER_GIB for p in j["peak_gib"]),
            minutes=tuple(float(m) for m in j["minutes"]),
            ramp_s=float(j["ramp_s"]),
            late_oom_at=float(j.get("late_oom_at", 0.0)),
            late_oom_levels=int(j.get("late_oom_levels", 1)),
            startup_s=float(j.get("startup_s", 0.0)),
            startup_mib=float(j.get("startup_gib", 0.0)) * MIB_PER_GIB,
        )
        for j in raw["jobs"]
    )
    for job in jobs:
        if len(job.peak_mib) != LEVELS or len(job.minutes) != LEVELS:
            raise ValueError(f"job {job.id}: expected {LEVELS} levels")
    sharing = tuple(float(x) for x in raw["sharing"]) if raw.get("sharing") else None
    return Trace(gpus, parse_plan(raw["plan"], len(gpus)), jobs, sharing)
