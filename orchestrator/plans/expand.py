"""Expanding a loaded suite into jobs: configs × pairs, `--set` overrides, rounds, identities.

Pure: takes a `Suite` (plans.suite) and returns `JobSpec`s. Every problem raises PlanError.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from orchestrator.errors import PlanError
from orchestrator.plans.grid import MAX_GRID_JOBS
from orchestrator.plans.inputs import Pair, Scalar
from orchestrator.plans.model import ConfigSpec, JobSpec, Suite, canonical_json
from orchestrator.plans.resources import job_resources


def job_identity(suite: str, config: ConfigSpec, pair: Pair, overrides: dict[str, Scalar]) -> str:
    """Stable id of what a job computes: suite, config content, seed, data and overrides."""
    payload = canonical_json(
        {
            "suite": suite,
            "config": config.name,
            "content": config.content,
            "seed": pair.seed,
            "data": pair.data,
            "overrides": overrides,
        }
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def expand_jobs(
    suite: Suite,
    pairs: Sequence[Pair],
    overrides: dict[str, Scalar],
    round_selector: int | str | None,
    total_slots: int,
    grid: Sequence[dict[str, Scalar]] = ({},),
    trials: bool = False,
) -> list[JobSpec]:
    """Suite configs × grid assignments × pairs (config-major, as the bash launchers ordered
    them), then the round. Each assignment of the grid (plans.grid.combinations) joins the
    overrides of its jobs, so they are jobs of their own (their identity names it). `trials`: the
    assignments are a search's trials, numbered in their order."""
    if len(suite.configs) * len(grid) * len(pairs) > MAX_GRID_JOBS:
        values = "trials" if trials else "grid values"
        raise PlanError(f"suite {suite.name}: {len(suite.configs)} configs × {len(grid)} {values} × "
                        f"{len(pairs)} pairs is more than {MAX_GRID_JOBS} jobs")
    config_overrides = {k: v for k, v in overrides.items() if not k.startswith("env.")}
    env = dict(suite.env)
    env.update({k[len("env."):]: "" if v is None else str(v) for k, v in overrides.items() if k.startswith("env.")})
    configs: Sequence[ConfigSpec] = suite.configs
    if isinstance(round_selector, str):
        if round_selector not in suite.rounds:
            known = ", ".join(suite.rounds) or "none"
            raise PlanError(f"suite {suite.name} has no round {round_selector!r} (named rounds: {known})")
        wanted = set(suite.rounds[round_selector])
        configs = [c for c in suite.configs if c.name in wanted]
    elif isinstance(round_selector, int) and suite.rounds:
        names = list(suite.rounds)
        if round_selector > len(names):
            raise PlanError(
                f"--round {round_selector}: suite {suite.name} has {len(names)} named rounds ({', '.join(names)})"
            )
        wanted = set(suite.rounds[names[round_selector - 1]])
        configs = [c for c in suite.configs if c.name in wanted]
    jobs: list[JobSpec] = []
    for config, (number, assignment), pair in ((c, a, p) for c in configs for a in enumerate(grid) for p in pairs):
        job_overrides = {**overrides, **assignment}
        merged = {**config.content, **config_overrides}
        merged.update({k: v for k, v in assignment.items() if not k.startswith("env.")})
        merged["seed"] = pair.seed
        merged["data"] = pair.data
        job_env = {**env, **{k[len("env."):]: "" if v is None else str(v) for k, v in assignment.items()
                             if k.startswith("env.")}}
        gpus, cpus = job_resources(merged, suite.gpus, suite.cpus, f"config {config.name}")
        jobs.append(JobSpec(suite=suite.name, config_name=config.name, config_path=str(config.path), config=merged,
                            seed=pair.seed, data=pair.data, overrides=job_overrides, env=job_env,
                            identity=job_identity(suite.name, config, pair, job_overrides), gpus=gpus, cpus=cpus,
                            trial=number if trials else None))
    if isinstance(round_selector, int) and not suite.rounds:
        # No named rounds: the Nth slice of size Σ plan, as the bash launchers sliced the suite.
        if total_slots < 1:
            raise PlanError("--round N needs a GPU plan with at least one slot to size the rounds")
        n_rounds = max(1, math.ceil(len(jobs) / total_slots))
        if round_selector > n_rounds:
            raise PlanError(
                f"--round {round_selector}: suite {suite.name} × {len(pairs)} pair(s) makes "
                f"{len(jobs)} jobs = {n_rounds} round(s) of {total_slots} slots"
            )
        start = (round_selector - 1) * total_slots
        jobs = jobs[start : start + total_slots]
    return jobs
