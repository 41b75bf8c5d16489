"""Queueing a sweep: suite × grid × pairs into jobs, idempotently. The one implementation of
`orch submit` and `Sweep.submit()`: the CLI hands it text as a user types it, Python its values
(never turned into `--grid` text and back), both typed by the configs the same way. Everything
is validated before the database is touched, and a grid's size before a job of it is built."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from orchestrator.plans.early_stop import Mode, describe_pruned
from orchestrator.plans.grid import (
    MAX_GRID_JOBS,
    check_grid_size,
    combinations,
    given_grid,
    given_sets,
    merge_grids,
    parse_grid,
    parse_sets,
    seed_pairs,
)
from orchestrator.plans.inputs import Pair, Scalar, shown_repr, shown_value
from orchestrator.plans.ladder_spec import is_one_token_task, load_ladder, strict_spec
from orchestrator.plans.metric_direction import lower_is_better
from orchestrator.plans.notify_urls import check_urls
from orchestrator.plans.optuna_lib import require_optuna
from orchestrator.plans.resources import check_gangs_fit
from orchestrator.plans.search import Search, SearchMethod
from orchestrator.plans.template import parse_template
from orchestrator.plans.trial_sampling import next_trial, random_trials
from orchestrator.plans.worker_output import check_keys_reach
from orchestrator.prediction.ladder import expand_levels
from orchestrator.store.db import Store
from orchestrator.store.early_stop import newest_rules, prune_jobs, stopped_settings
from orchestrator.store.jobs import SubmitOutcome, get_gpu_plan, set_gpu_plan, submit_jobs
from orchestrator.store.notify_queries import set_suite_notify_urls
from orchestrator.store.queries import last_seen_gpu_indices
from orchestrator.store.search import other_search, set_search_trials, submitted_before
from orchestrator.submit.suite_pause import resume_if_changed, worker_changed_since_failure

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
    seeds: str | None = None  # `--seeds 1-3`: these seeds × the suite's tasks (or alone: no task)
    set_values: Mapping[str, Any] | None = None  # {KEY: value} from Python
    grid_values: Mapping[str, Any] | None = None  # {KEY: [values]} from Python
    configs: Sequence[str] = ()  # `--config NAME`: only these configs of the suite; (): all of them


MAX_PRIORITY = 1000


def check_priority(priority: Any) -> int:
    """A priority is a whole number in -1000..1000, as `--priority` takes it."""
    whole = isinstance(priority, int) and not isinstance(priority, bool)
    if not whole or not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise UsageError(f"priority {shown_repr(priority)} is not a whole number "
                         f"between -{MAX_PRIORITY} and {MAX_PRIORITY}")
    return priority


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


def _pairs(request: SubmitRequest, suite: Suite) -> list[Pair]:
    """--pairs, else --seeds × the suite's tasks, else the suite's own seeds (× tasks)."""
    if request.pairs is not None and request.seeds is not None:
        raise UsageError("--pairs and --seeds both give seeds: give one")
    if request.pairs is not None:
        return parse_pairs(request.pairs)
    if request.seeds is not None:
        return seed_pairs(request.seeds, list(dict.fromkeys(p.data for p in suite.pairs if p.data)))
    if suite.pairs:
        return list(suite.pairs)
    raise UsageError(f"suite {suite.name} has no seeds:, so --seeds or --pairs is needed "
                     '(e.g. --seeds 1-3, or SEED:DATA pairs: --pairs "87:glue-tvt_qnli")')


def _refuse_both(what: str, text: Mapping[str, Any], values: Mapping[str, Any]) -> None:
    both = sorted(set(text) & set(values))
    if both:
        raise UsageError(f"{what} {both[0]} is given both as text and as a value: give it once")


def search_trials(
    suite: Suite, overrides: dict[str, Scalar], grid: dict[str, list[Scalar]], pairs: int = 1
) -> list[dict[str, Scalar]] | None:
    """The trials a suite's `search:` queues at submit: every one of a random search (the same
    ones for the same seed), the first of a TPE search (the daemon asks for the rest); None
    without a search."""
    search = suite.search
    if search is None:
        return None
    if grid:
        raise PlanError(f"suite {suite.name}: its search: and --grid both choose values: keep one")
    clash = sorted(dim.key for dim in search.space if dim.key in overrides)
    if clash:
        raise PlanError(f"--set {clash[0]} and the suite's search both set {clash[0]}: keep one")
    if search.trials * len(suite.configs) * max(pairs, 1) > MAX_GRID_JOBS:  # said before any trial is drawn
        pairs_shown = f" × {pairs} pairs" if pairs > 1 else ""
        raise PlanError(f"suite {suite.name}: {search.trials} trials × {len(suite.configs)} configs{pairs_shown} is "
                        f"more than {MAX_GRID_JOBS} jobs")
    if search.method is SearchMethod.RANDOM:
        return random_trials(search)
    return [next_trial(search, [], 0)]


def only_configs(suite: Suite, specs: list[JobSpec], names: Sequence[str]) -> list[JobSpec]:
    """The jobs of the configs named (`--config`); a name the suite does not have is refused."""
    have = [c.name for c in suite.configs]
    for name in names:
        if name not in have:
            raise UsageError(f"suite {suite.name} has no config {shown_value(name)} (its configs: {', '.join(have)})")
    return [spec for spec in specs if spec.config_name in names]


def settings_shuffled(specs: list[JobSpec], seed_text: str) -> list[JobSpec]:
    """The jobs with their settings (config and overrides) in a seeded shuffled order, each
    setting's seeds together: successive halving compares each setting with those that reached
    a rung before it, and a grid queued in order of its values (each better than the last) would
    keep nearly all of them. The same suite gives the same order every time."""
    by_setting: dict[str, list[JobSpec]] = {}
    for spec in specs:
        by_setting.setdefault(f"{spec.config_name} {sorted(spec.overrides.items())}", []).append(spec)
    keys = list(by_setting)
    random.Random(seed_text).shuffle(keys)
    return [spec for key in keys for spec in by_setting[key]]


def unreachable_early_stop_note(suite: Suite, specs: list[JobSpec]) -> str | None:
    """A line when no job of a `worker: lora` suite can reach early_stop's first rung: each one's
    `max_steps` (its last step, whatever its epochs) ends before `min_steps`, so none is stopped."""
    if suite.early_stop is None or suite.worker != "lora" or not specs:
        return None
    last_steps = [spec.config.get("max_steps") for spec in specs]
    if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in last_steps):
        return None  # some job runs by epochs: its length is not known here
    longest = max(int(s) for s in last_steps if s is not None)
    if longest >= suite.early_stop.min_steps:
        return None
    return (f"note: early_stop.min_steps {suite.early_stop.min_steps} is past every job's max_steps (at most "
            f"{longest}): no job reaches the first rung, so early stopping stops none")


def loss_mode_notes(suite: Suite) -> list[str]:
    """A line for an `early_stop` or `search` metric that reads as a loss (lower is better) while
    its mode is max, the default when `mode:` is left out: the best would be taken for the worst."""
    sections = [("early_stop", suite.early_stop), ("search", suite.search)]
    return [
        f"note: {name}.metric {section.metric} reads as a loss, but {name}.mode is max (the default when left "
        f"out): the highest value counts as best; write `mode: min` if lower is better"
        for name, section in sections
        if section is not None and section.metric and section.mode is Mode.MAX and lower_is_better(section.metric)
    ]


def random_note(suite: Suite, trials: list[dict[str, Scalar]] | None) -> str | None:
    """A line when a random search found fewer distinct settings than its `trials`."""
    search = suite.search
    if search is None or search.method is not SearchMethod.RANDOM or trials is None:
        return None
    if len(trials) >= search.trials:
        return None
    return (f"note: random search: {len(trials)} trials, not {search.trials}: its space has no other "
            "setting (a trial never repeats another's)")


TPE_NOTE = "note: tpe search:"


def tpe_note(suite: Suite, dry_run: bool = False) -> str | None:
    if suite.search is None or suite.search.method is not SearchMethod.TPE or suite.search.trials < 2:
        return None
    queued = "would be queued now (a dry run queues nothing)" if dry_run else "is queued now"
    return (f"{TPE_NOTE} trial 0 {queued}; the daemon asks for trials 1 to {suite.search.trials - 1} "
            "one at a time, when the search has no job left in the queue")


def prune_seeds_of_stopped_settings(store: Store, suite: str, outcomes: list[SubmitOutcome],
                                    dry_run: bool) -> tuple[list[SubmitOutcome], list[str]]:
    """Stopping a setting stops all of its seeds: a job queued for a stopped setting (a new seed,
    or one queued again with --force) ends pruned at once, with the setting's record, never
    started. The outcomes, those marked; a note says how many."""
    stopped = stopped_settings(store, suite)
    if not stopped:
        return outcomes, []
    marked: list[SubmitOutcome] = []
    for outcome in outcomes:
        spec = outcome.spec
        record = stopped.get((spec.data, spec.config_name, json.dumps(spec.overrides, sort_keys=True)))
        if not outcome.created or record is None:
            marked.append(outcome)
            continue
        if not dry_run and outcome.job_id is not None:
            prune_jobs(store, [outcome.job_id], record, f"{describe_pruned(record)}, before this job was queued")
        marked.append(dataclasses.replace(outcome, pruned_at_once=True))
    count = sum(o.pruned_at_once for o in marked)
    if not count:
        return marked, []
    verb = "would end" if dry_run else "end"
    return marked, [f"note: {count} of the jobs queued {verb} pruned at once, never started: early stopping had "
                    "stopped their settings (`orch retry JOB` runs one on)"]


def changed_rule_note(held: Mapping[str, Mapping[str, Any]], rule: Mapping[str, Any] | None,
                      outcomes: Sequence[SubmitOutcome], tpe: bool, dry_run: bool = False) -> str | None:
    """A line when the suite file's early_stop differs from the rule the suite's jobs on the
    submitted tasks were queued with (`held`, per task): a suite and task are judged by their
    newest job's rule, so a new one counts only once a job holds it."""
    tasks = {o.spec.data for o in outcomes}
    differing = sorted({json.dumps(dict(held[t]), sort_keys=True) for t in tasks & set(held)
                        if dict(held[t]) != dict(rule or {})})
    if not differing:
        return None
    old = json.loads(differing[0])
    if rule is None:
        return ("note: the suite file has no early_stop:, but its jobs were queued with one "
                f"({', '.join(f'{k} {v}' for k, v in old.items())}): they are still judged by it; "
                "the jobs queued now are not judged")
    changes = ", ".join(f"{key} {old.get(key, '-')} → {rule.get(key, '-')}"
                        for key in sorted(set(old) | set(rule)) if old.get(key) != rule.get(key))
    said = f"note: early_stop differs from the rule this suite's jobs were queued with ({changes})"
    if any(o.created for o in outcomes):
        queued = "the jobs this would queue" if dry_run else "the jobs queued now"
        return (f"{said}: {queued} hold it, and each task they run on is judged by it from then on "
                "(the values told under the old rule are dropped)")
    if tpe:
        return f"{said}: not used: a tpe search's later trials copy its trial 0's rule"
    return f"{said}: no job is queued with it, so nothing changes"


def refuse_another_search(suite_name: str, search: Search, held: Mapping[str, Any]) -> None:
    """A suite holds one search: trials are numbered and ranked per suite, so a second search's
    trial 3 would be pooled with the first's. Only `trials` changes a search in place."""
    wanted = search.to_json()
    differs = [key for key in ("method", "seed", "metric", "mode", "space") if held.get(key) != wanted.get(key)]
    raise UsageError(f"suite {suite_name} already holds a {held.get('method')} search, and this one differs in its "
                     f"{', '.join(differs) or 'spec'}: a suite holds one search (only `trials` changes in place); "
                     f"submit a changed search as a suite of its own (a copy of its suite file under a new name)")


def tpe_again_note(search: Search, found: tuple[int, int] | None, dry_run: bool, created: int = 0) -> list[str]:
    """What a TPE search submitted again does: `found` is (trials asked so far, `trials` it had),
    or None when its trial 0's jobs are already there as grid jobs of the suite (the same setting;
    another search is refused before this). `created`: trial-0 jobs queued now (new pairs)."""
    if found is None:
        return [f"{TPE_NOTE} its trial 0 is already queued as a grid job of this suite (the same setting): "
                "this search queues nothing; change its seed or space to start it"]
    asked, had = found
    would = "would ask" if dry_run else "asks"
    if created:
        pairs = (f"{TPE_NOTE} trial 0 of the new pairs {'would be' if dry_run else 'is'} queued ({created} "
                 "job(s), or again with --force); the trials already asked keep their pairs, later trials take "
                 "every pair")
        return [pairs, *tpe_again_note(search, found, dry_run)]
    if search.trials > had and search.trials > asked:
        more = f"trials {asked} to {search.trials - 1}" if search.trials - asked > 1 else f"trial {asked}"
        return [f"{TPE_NOTE} submitted before with {had} trials ({asked} asked so far): now {search.trials}, "
                f"the daemon {would} for {more} one at a time"]
    if search.trials < had:
        return [f"{TPE_NOTE} submitted before with {had} trials ({asked} asked so far): now {search.trials}, "
                f"the daemon {would} for {'no more' if asked >= search.trials else 'fewer'}"]
    return [f"{TPE_NOTE} already submitted ({asked} of {had} trials asked so far): no new trial is queued"]


def submit_sweep(request: SubmitRequest, db_path: Path, plans_dir: Path | None = None,
                 opener: Opener = Store) -> SubmitReport:
    """Parse and check everything, then queue (or, with dry_run, only say) the jobs."""
    check_priority(request.priority)
    round_selector = parse_round(request.round)
    gpus = parse_gpus(request.gpus) if request.gpus is not None else None
    plan = parse_gpu_plan(request.gpu_plan, gpus) if request.gpu_plan is not None else None
    suite = load_suite(request.suite, plans_dir or default_plans_dir())
    if request.strict_ladder:
        suite = dataclasses.replace(suite, ladder=strict_spec(suite.ladder))
    pairs = _pairs(request, suite)
    known = suite.known_keys()
    overrides = parse_sets(request.sets, known, suite.configs)
    sources = {**{k: "grid:" for k in suite.grid}, **dict.fromkeys(overrides, "--set")}
    if request.set_values is not None:
        given = given_sets("sets", request.set_values, known, suite.configs)
        _refuse_both("sets", overrides, given)
        overrides.update(given)
        sources.update(dict.fromkeys(given, "sets"))
    asked = parse_grid(request.grid, known, suite.configs, overrides)
    sources.update(dict.fromkeys(asked, "--grid"))
    if request.grid_values is not None and not (isinstance(request.grid_values, Mapping)
                                                and not request.grid_values):  # {}: no grid
        given_values = given_grid("grid", request.grid_values, known, suite.configs, overrides)
        _refuse_both("grid", asked, given_values)
        asked.update(given_values)
        sources.update(dict.fromkeys(given_values, "grid"))
    grid = merge_grids({k: v for k, v in suite.grid.items() if k not in overrides}, asked)
    check_keys_reach(suite, {k: v for k, v in sources.items() if k in overrides or k in grid})
    check_grid_size(f"suite {suite.name}", grid, len(suite.configs), len(pairs))

    # Validate the round before anything is created: a bad round must leave no state.db behind.
    stored_plan = None
    if isinstance(round_selector, int) and not suite.rounds and plan is None and db_path.exists():
        with opener(db_path) as reader:
            stored_plan = get_gpu_plan(reader)
    total_slots = 0
    if isinstance(round_selector, int) and not suite.rounds:
        total_slots = _round_slots(plan, stored_plan, gpus)
    trials = search_trials(suite, overrides, grid, len(pairs))
    if trials is not None:
        grid = {dim.key: [t[dim.key] for t in trials] for dim in suite.search.space}  # what a dry run shows
    specs = expand_jobs(suite, pairs, overrides, round_selector, total_slots,
                        trials if trials is not None else combinations(grid), trials=trials is not None)
    if request.configs:
        specs = only_configs(suite, specs, request.configs)
    if suite.early_stop is not None:
        specs = settings_shuffled(specs, suite.name)
    if gpus is not None:
        check_gpus_exist(gpus, db_path, "--gpus", opener)
    if plan is not None and gpus is None:
        check_gpus_exist(
            sorted(plan.slots_by_gpu),
            db_path,
            f"--gpu-plan {shown_value(request.gpu_plan or '')}",
            opener,
        )
    _check_gangs_fit(specs, gpus, db_path, opener)
    check_urls(suite.notify, f"suite {suite.name} notify")
    check_worker_template(suite, specs, {**overrides, **dict.fromkeys(grid)})  # the grid's keys are set too
    if suite.early_stop is not None or suite.search is not None:
        require_optuna()  # the daemon runs its pruner: a missing library is said now, not at the first rung
    notes = [n for n in (unreached_rungs_note(suite, specs), unreachable_early_stop_note(suite, specs),
                         tpe_note(suite, request.dry_run), random_note(suite, trials)) if n] + loss_mode_notes(suite)

    if request.dry_run and not db_path.exists():
        return SubmitReport(suite, [SubmitOutcome(spec, None, True, None) for spec in specs], plan, grid, notes)
    tpe = suite.search if suite.search is not None and suite.search.method is SearchMethod.TPE else None
    if suite.search is not None and db_path.exists():
        with opener(db_path) as reader:  # refused before anything is written
            held = other_search(reader, suite.name, suite.search.to_json())
        if held is not None:
            refuse_another_search(suite.name, suite.search, held)
    with opener(db_path, create=True) as store:
        # a TPE search already submitted (the same spec but for its trials), read before queuing
        earlier = submitted_before(store, suite.name, tpe.to_json()) if tpe is not None else None
        held_rules = newest_rules(store, suite.name)
        with store.write():  # a new seed of a stopped setting is pruned before any pass can start it
            outcomes = submit_jobs(store, suite, specs, allowed_gpus=gpus, priority=request.priority,
                                   force=request.force, dry_run=request.dry_run)
            if suite.early_stop is not None:
                outcomes, pruned_note = prune_seeds_of_stopped_settings(store, suite.name, outcomes, request.dry_run)
                notes += pruned_note
        rule_note = changed_rule_note(held_rules, suite.early_stop.to_json() if suite.early_stop else None,
                                      outcomes, tpe is not None, request.dry_run)
        notes += [rule_note] if rule_note else []
        if plan is not None and not request.dry_run:
            set_gpu_plan(store, plan)
        if not request.dry_run:
            set_suite_notify_urls(store, suite.name, suite.notify)
        if tpe is not None and (earlier is not None or not any(o.created for o in outcomes)):
            if earlier is not None and earlier[1] != tpe.trials and not request.dry_run:
                set_search_trials(store, suite.name, tpe.to_json())
            notes = [n for n in notes if not n.startswith(TPE_NOTE)]
            notes += tpe_again_note(tpe, earlier, request.dry_run, sum(o.created for o in outcomes))
        if not request.dry_run and any(o.created for o in outcomes):
            changed = worker_changed_since_failure(store, suite.name, suite.worker)
            paused_note = resume_if_changed(store, suite.name, changed)
            if paused_note:
                notes.append(f"note: {paused_note}")
    return SubmitReport(suite, outcomes, plan, grid, notes)
