"""Queueing a sweep: suite × grid × pairs into jobs, idempotently. The one implementation of
`orch submit` and `Sweep.submit()`; both hand it text as a user types it, so a value is parsed
and typed the same way whichever asked. Everything is validated before the database is touched."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.actions.suite_changes import resume_if_changed, worker_changed_since_failure
from orchestrator.daemon.notify import check_urls
from orchestrator.errors import PlanError, UsageError
from orchestrator.gpu import machine_gpu_indices
from orchestrator.plans import (
    GpuPlan,
    JobSpec,
    Suite,
    check_worker_template,
    default_plans_dir,
    expand_jobs,
    load_suite,
    parse_gpu_plan,
    parse_gpus,
    parse_pairs,
    parse_round,
)
from orchestrator.plans.grid import combinations, merge_grids, parse_grid, parse_sets
from orchestrator.plans.inputs import Scalar, shown_value
from orchestrator.plans.ladder_spec import is_one_token_task, load_ladder, strict_spec
from orchestrator.plans.resources import check_gangs_fit
from orchestrator.plans.template import parse_template
from orchestrator.prediction.ladder import expand_levels
from orchestrator.store.db import Store
from orchestrator.store.jobs import SubmitOutcome, get_gpu_plan, set_gpu_plan, submit_jobs
from orchestrator.store.notify_queries import set_suite_notify_urls
from orchestrator.store.queries import last_seen_gpu_indices

Opener = Callable[..., Store]  # (db_path, create=...) -> Store: the CLI's checks the lost-file daemon


@dataclass(frozen=True)
class SubmitRequest:
    """What to queue, as text a user types (`--pairs`, `--set`, `--grid`, ...)."""

    suite: str
    pairs: str | None = None  # SEED:DATA pairs; None: the suite's seeds × tasks
    sets: Sequence[str] = ()  # KEY=VALUE
    grid: Sequence[str] = ()  # KEY=V1,V2
    round: str = "all"
    gpus: str | None = None
    gpu_plan: str | None = None
    priority: int = 0
    dry_run: bool = False
    force: bool = False
    strict_ladder: bool = False  # exact rungs only (plans.ladder_spec.strict_spec)


@dataclass(frozen=True)
class SubmitReport:
    suite: Suite
    outcomes: list[SubmitOutcome]
    plan: GpuPlan | None
    grid: dict[str, list[Scalar]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def created(self) -> list[SubmitOutcome]:
        return [o for o in self.outcomes if o.created]

    @property
    def existing(self) -> list[SubmitOutcome]:
        return [o for o in self.outcomes if not o.created]


def known_gpu_indices(db_path: Path, opener: Opener = Store) -> list[int] | None:
    """This machine's GPU indices: the daemon's last reading, else the simulated GPUs or NVML
    here; None when they cannot be known."""
    known = None
    if db_path.exists():
        with opener(db_path) as reader:
            known = last_seen_gpu_indices(reader)
    return known if known is not None else machine_gpu_indices()


def check_gpus_exist(gpus: list[int], db_path: Path, what: str, opener: Opener = Store) -> None:
    """Refuse `what` (--gpus, or a plan's entries) naming a GPU this machine lacks, when its GPUs
    are known: from the daemon's last reading, else the simulated GPUs or NVML here. Unknown:
    the daemon's wait reason says it."""
    known = known_gpu_indices(db_path, opener)
    if known is None:
        return
    missing = [g for g in gpus if g not in known]
    if missing:
        names = ", ".join(map(str, missing))
        raise PlanError(
            f"{what} names GPU {names}, which this machine does not have (its GPUs: {' '.join(map(str, known))})"
        )


def _round_slots(plan: GpuPlan | None, stored: GpuPlan | None, gpus: list[int] | None) -> int:
    """Σ plan, the size of one bash-launcher round."""
    for candidate in (plan, stored):
        if candidate is None:
            continue
        if gpus is not None:
            return candidate.total_slots(gpus, fallback=1)
        if candidate.slots_by_gpu:
            return sum(candidate.slots_by_gpu.values())
    raise PlanError(
        "--round N on a suite without named rounds needs --gpu-plan (with --gpus for a single "
        "number) to know the round size Σ plan"
    )


def _check_gangs_fit(specs: list[JobSpec], gpus: list[int] | None, db_path: Path, opener: Opener) -> None:
    """A job of `gpus: N` with fewer than N GPUs it may use is refused: it would wait forever."""
    needed = {spec.config_name: spec.gpus for spec in specs if spec.gpus > 1}
    if not needed:
        return
    if gpus is not None:
        check_gangs_fit(needed, gpus, "--gpus gives it")
        return
    known = known_gpu_indices(db_path, opener)
    if known is not None:
        check_gangs_fit(needed, known, "this machine has")


def unreached_rungs_note(suite: Suite, specs: list[JobSpec]) -> str | None:
    """A line naming the ladder changes the worker command cannot receive (those rungs are
    skipped for this suite), and how to wire them; None when every change reaches it."""
    if suite.worker in ("lora", "sim"):
        return None
    template = parse_template(suite.worker)
    if template.reads_config:
        return None
    ladder = load_ladder(suite.ladder)
    unreached: dict[str, tuple[str, object]] = {}  # script key -> (rung, a value it sets)
    for spec in specs:
        one_token = is_one_token_task(spec.data, list(suite.one_token_tasks))
        for level in expand_levels(ladder, suite.keys.to_orch(spec.config), one_token):
            for key, value in level.changes.items():
                script_key = suite.keys.script_key(key)
                if not template.reaches(script_key):
                    unreached.setdefault(script_key, (level.rung, value))
    if not unreached:
        return None
    shown = ", ".join(f"{key} (rung {rung})" for key, (rung, _) in unreached.items())
    key, (_, value) = next(iter(unreached.items()))
    flag = f"--{key.replace('_', '-')}"
    # a switch gets the flag-presence form; a value needs the key in every config to be filled
    wire = (f"{{cfg.{key}?{flag}}}" if isinstance(value, bool)
            else f"{flag} {{cfg.{key}}} (with {key} set in every config)")
    return (f"note: the worker command cannot receive {shown}: orch skips those changes; pass {{config}} "
            f"or add e.g. {wire} to the command to wire them")


def submit_sweep(request: SubmitRequest, db_path: Path, plans_dir: Path | None = None,
                 opener: Opener = Store) -> SubmitReport:
    """Parse and check everything, then queue (or, with dry_run, only say) the jobs."""
    round_selector = parse_round(request.round)
    gpus = parse_gpus(request.gpus) if request.gpus is not None else None
    plan = parse_gpu_plan(request.gpu_plan, gpus) if request.gpu_plan is not None else None
    suite = load_suite(request.suite, plans_dir or default_plans_dir())
    if request.strict_ladder:
        suite = dataclasses.replace(suite, ladder=strict_spec(suite.ladder))
    if request.pairs is not None:
        pairs = parse_pairs(request.pairs)
    elif suite.pairs:
        pairs = list(suite.pairs)
    else:
        raise UsageError(f"suite {suite.name} has no seeds: and tasks:, so --pairs is needed "
                         '(SEED:DATA pairs, e.g. --pairs "87:glue-tvt_qnli")')
    known = suite.known_keys()
    overrides = parse_sets(request.sets, known, suite.configs)
    grid = merge_grids({k: v for k, v in suite.grid.items() if k not in overrides},
                       parse_grid(request.grid, known, suite.configs, overrides))

    # Validate the round before anything is created: a bad round must leave no state.db behind.
    stored_plan = None
    if isinstance(round_selector, int) and not suite.rounds and plan is None and db_path.exists():
        with opener(db_path) as reader:
            stored_plan = get_gpu_plan(reader)
    total_slots = 0
    if isinstance(round_selector, int) and not suite.rounds:
        total_slots = _round_slots(plan, stored_plan, gpus)
    specs = expand_jobs(suite, pairs, overrides, round_selector, total_slots, combinations(grid))
    if gpus is not None:
        check_gpus_exist(gpus, db_path, "--gpus", opener)
    if plan is not None and gpus is None:
        check_gpus_exist(sorted(plan.slots_by_gpu), db_path, f"--gpu-plan {shown_value(request.gpu_plan or '')}", opener)
    _check_gangs_fit(specs, gpus, db_path, opener)
    check_urls(suite.notify, f"suite {suite.name} notify")
    check_worker_template(suite, specs, {**overrides, **dict.fromkeys(grid)})  # the grid's keys are set too
    notes = [n for n in (unreached_rungs_note(suite, specs),) if n]

    if request.dry_run and not db_path.exists():
        return SubmitReport(suite, [SubmitOutcome(spec, None, True, None) for spec in specs], plan, grid, notes)
    with opener(db_path, create=True) as store:
        outcomes = submit_jobs(store, suite, specs, allowed_gpus=gpus, priority=request.priority,
                               force=request.force, dry_run=request.dry_run)
        if plan is not None and not request.dry_run:
            set_gpu_plan(store, plan)
        if not request.dry_run:
            set_suite_notify_urls(store, suite.name, suite.notify)
        if not request.dry_run and any(o.created for o in outcomes):
            changed = worker_changed_since_failure(store, suite.name, suite.worker)
            paused_note = resume_if_changed(store, suite.name, changed)
            if paused_note:
                notes.append(f"note: {paused_note}")
    return SubmitReport(suite, outcomes, plan, grid, notes)
