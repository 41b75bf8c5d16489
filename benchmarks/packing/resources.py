"""Multi-GPU jobs and host RAM at virtual time: orch's `pack` against simpler launchers.

    python -m benchmarks.packing.resources --trace benchmarks/traces/gangs_host_4x24.yaml [--json]

Every job is submitted at t=0 and runs its trace minutes once started (cards are not shared:
plan 1). A job holds its per-rank peak on each of its cards and its host RAM for its whole run.
A launcher that starts jobs beyond the host's RAM has the newest one killed by the kernel one
minute in (a host OOM: its GPU-minutes are lost and it goes back to the queue). Policies:

- `orch`: the real `orchestrator.scheduling.packing.pack.pack` with gangs, host RAM (`HostState`, the trace's
  reserve) and run times learned from the first finished job of each config;
- `greedy`: queue order, any job whose GPU count is free starts (backfill), host RAM ignored;
- `greedy+host`: the same, but a job waits while its host RAM does not fit; no reservation;
- `fifo+host`: strict queue order (the first job that does not fit blocks the rest), host-aware;
- `oracle`: the best of 300 list schedules (random orders and longest-first, host-aware, with
  backfill) computed offline with every run time known: a good schedule, not a proven optimum.

The lower bound is max(longest job, GPU-minutes / cards, host GiB-minutes / usable host GiB).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from orchestrator.scheduling.packing.gang import HostState
from orchestrator.scheduling.packing.pack import pack
from orchestrator.scheduling.packing.types import GpuState, PackingPolicy, QueuedJob, RunningAttempt

GIB = 1024
KILL_AFTER_MIN = 1.0  # a host OOM kills the newest job when its data loader starts


@dataclass(frozen=True)
class Job:
    id: str
    config: str
    gpus: int
    peak_gib: float
    host_gib: float
    minutes: float


@dataclass(frozen=True)
class Machine:
    gpu_gib: tuple[float, ...]
    host_gib: float
    host_reserve_gib: float


@dataclass
class Run:
    job: Job
    cards: tuple[int, ...]
    start: float
    end: float
    killed: bool = False


@dataclass
class Result:
    makespan_min: float
    host_oom_kills: int
    lost_gpu_min: float
    max_gang_wait_min: float
    partial_gangs: int


Decide = Callable[[float, list[Job], list[Run], Machine, dict[str, float]], list[tuple[Job, tuple[int, ...]]]]


def load(path: Path) -> tuple[Machine, list[Job]]:
    raw = yaml.safe_load(path.read_text())
    m = raw["machine"]
    machine = Machine(
        tuple(float(g["total_gib"]) for g in m["gpus"]),
        float(m["host_gib"]),
        float(m["host_reserve_gib"]),
    )
    jobs = [Job(str(j["id"]), str(j["config"]), int(j["gpus"]), float(j["peak_gib"]), float(j["host_gib"]),
                float(j["minutes"])) for j in raw["jobs"]]  # fmt: skip
    return machine, jobs


def free_cards(machine: Machine, running: list[Run]) -> list[int]:
    busy = {c for r in running for c in r.cards}
    return [i for i in range(len(machine.gpu_gib)) if i not in busy]


def host_used(running: list[Run]) -> float:
    return sum(r.job.host_gib for r in running)


def simulate(machine: Machine, jobs: list[Job], decide: Decide) -> Result:
    queue = list(jobs)
    running: list[Run] = []
    learned: dict[str, float] = {}
    now, kills, lost, partial = 0.0, 0, 0.0, 0
    gang_wait = 0.0
    while queue or running:
        for job, cards in decide(now, list(queue), list(running), machine, dict(learned)):
            if len(set(cards)) != job.gpus:
                partial += 1
            queue.remove(job)
            run = Run(job, cards, now, now + job.minutes)
            if host_used(running) + job.host_gib > machine.host_gib:
                run.end, run.killed = now + min(KILL_AFTER_MIN, job.minutes), True
            running.append(run)
            if job.gpus > 1:
                gang_wait = max(gang_wait, now)
        if not running:
            return Result(math.inf, kills, lost, gang_wait, partial)  # nothing can ever start
        now = min(r.end for r in running)
        for run in [r for r in running if r.end <= now]:
            running.remove(run)
            if run.killed:
                kills += 1
                lost += run.job.gpus * (run.end - run.start)
                queue.insert(0, run.job)
            else:
                learned[run.job.config] = run.job.minutes
    return Result(now, kills, lost, gang_wait, partial)


def orch_policy(
    now: float, queue: list[Job], running: list[Run], machine: Machine, learned: dict[str, float]
) -> list[tuple[Job, tuple[int, ...]]]:
    by_id = {n: j for n, j in enumerate(queue)}
    gpus = []
    held = {c: r for r in running for c in r.cards}
    for i, total in enumerate(machine.gpu_gib):
        used = held[i].job.peak_gib if i in held else 0.0
        gpus.append(GpuState(i, f"GPU-{i}", int(total * GIB), int((total - used) * GIB), 1))
    attempts = [
        RunningAttempt(hash(r.job.id) & 0xFFFF, c, int(r.job.peak_gib * GIB), int(r.job.peak_gib * GIB), True,
                       expected_end_s=(r.start + learned[r.job.config]) * 60 if r.job.config in learned else None)
        for r in running for c in r.cards
    ]  # fmt: skip
    queued = [
        QueuedJob(n, 0, n, int(j.peak_gib * GIB), 0.0, gpus=j.gpus, host_mib=int(j.host_gib * GIB),
                  expected_duration_s=learned[j.config] * 60 if j.config in learned else None)
        for n, j in by_id.items()
    ]  # fmt: skip
    usable = machine.host_gib - machine.host_reserve_gib
    host = HostState(int((usable - host_used(running)) * GIB), int(usable * GIB))
    decision = pack(queued, gpus, attempts, PackingPolicy(headroom_fraction=0.0), now * 60, host=host)
    return [(by_id[p.job_id], p.all_gpus) for p in decision.placements]


def list_policy(host_aware: bool, backfill: bool) -> Decide:
    def decide(
        now: float,
        queue: list[Job],
        running: list[Run],
        machine: Machine,
        learned: dict[str, float],
    ) -> list[tuple[Job, tuple[int, ...]]]:
        free = free_cards(machine, running)
        host_free = machine.host_gib - machine.host_reserve_gib - host_used(running)
        out = []
        for job in queue:
            fits = len(free) >= job.gpus and (not host_aware or job.host_gib <= host_free)
            if fits:
                cards, free = tuple(free[: job.gpus]), free[job.gpus :]
                host_free -= job.host_gib
                out.append((job, cards))
            elif not backfill:
                break
        return out

    return decide


def oracle(machine: Machine, jobs: list[Job], tries: int = 300) -> Result:
    rng = random.Random(7)
    orders = [sorted(jobs, key=lambda j: -j.minutes * j.gpus)]
    for _ in range(tries - 1):
        order = list(jobs)
        rng.shuffle(order)
        orders.append(order)
    results = [simulate(machine, order, list_policy(host_aware=True, backfill=True)) for order in orders]
    return min(results, key=lambda r: r.makespan_min)


def lower_bound_min(machine: Machine, jobs: list[Job]) -> float:
    return max(
        max(j.minutes for j in jobs),
        sum(j.gpus * j.minutes for j in jobs) / len(machine.gpu_gib),
        sum(j.host_gib * j.minutes for j in jobs) / (machine.host_gib - machine.host_reserve_gib),
    )


def run_all(machine: Machine, jobs: list[Job]) -> dict[str, Result]:
    return {
        "orch": simulate(machine, jobs, orch_policy),
        "greedy": simulate(machine, jobs, list_policy(host_aware=False, backfill=True)),
        "greedy+host": simulate(machine, jobs, list_policy(host_aware=True, backfill=True)),
        "fifo+host": simulate(machine, jobs, list_policy(host_aware=True, backfill=False)),
        "oracle": oracle(machine, jobs),
    }


def report(machine: Machine, jobs: list[Job]) -> dict[str, object]:
    bound = lower_bound_min(machine, jobs)
    return {
        "lower_bound_min": round(bound, 1),
        "policies": {
            name: {"makespan_min": round(r.makespan_min, 1), "ratio": round(r.makespan_min / bound, 3),
                   "host_oom_kills": r.host_oom_kills, "lost_gpu_min": round(r.lost_gpu_min, 1),
                   "last_gang_start_min": round(r.max_gang_wait_min, 1), "partial_gangs": r.partial_gangs}
            for name, r in run_all(machine, jobs).items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.packing.resources")
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    data = report(*load(args.trace))
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"lower bound {data['lower_bound_min']} min")
    print(f"{'policy':<13}{'makespan':>10}{'ratio':>7}{'host OOMs':>11}{'lost GPU-min':>14}{'last gang start':>17}")
    policies = data["policies"]
    assert isinstance(policies, dict)
    for name, r in policies.items():
        print(f"{name:<13}{r['makespan_min']:>10}{r['ratio']:>7}{r['host_oom_kills']:>11}{r['lost_gpu_min']:>14}"
              f"{r['last_gang_start_min']:>17}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
