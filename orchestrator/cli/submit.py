"""`orch submit`: expand a suite × pairs into jobs and queue them, idempotently."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.actions.suite_changes import resume_if_changed, worker_changed_since_failure
from orchestrator.cli.common import (
    check_gpus_exist,
    db_option,
    describe_plan,
    echo_json,
    json_option,
    known_gpu_indices,
    open_store,
    plans_option,
)
from orchestrator.daemon.notify import check_urls
from orchestrator.errors import PlanError
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
    parse_set_overrides,
)
from orchestrator.plans.inputs import shown_value
from orchestrator.plans.ladder_spec import is_one_token_task, load_ladder
from orchestrator.plans.resources import check_gangs_fit
from orchestrator.plans.template import parse_template
from orchestrator.prediction.ladder import expand_levels
from orchestrator.store.jobs import (
    SubmitOutcome,
    format_plan,
    get_gpu_plan,
    set_gpu_plan,
    submit_jobs,
)
from orchestrator.store.notify_queries import set_suite_notify_urls


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


def _check_gangs_fit(specs: list[JobSpec], gpus: list[int] | None, db_path: Path) -> None:
    """A job of `gpus: N` with fewer than N GPUs it may use is refused: it would wait forever."""
    needed = {spec.config_name: spec.gpus for spec in specs if spec.gpus > 1}
    if not needed:
        return
    if gpus is not None:
        check_gangs_fit(needed, gpus, "--gpus gives it")
        return
    known = known_gpu_indices(db_path)
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
                    unreached.setdefault(script_key, (level.step, value))
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


@click.command("submit")
@click.option("--suite", "suite_name", required=True, help="Suite name (plans/suites/NAME.yaml).")
@click.option("--pairs", "pairs_text", required=True, help='SEED:DATA pairs, e.g. "87:glue-tvt_qnli 127:glue-tvt_rte".')
@click.option("--round", "round_text", default="all", show_default=True, help="all, a round number (1-based) or a named round.")
@click.option("--gpus", "gpus_text", default=None, help='Restrict these jobs to GPUs, e.g. "0 1 2 3".')
@click.option("--gpu-plan", "plan_text", default=None, help='Per-GPU concurrency caps, e.g. "2,2,1" (stored for the daemon).')
@click.option("--set", "set_items", multiple=True, metavar="KEY=VALUE", help="Override a config key (YAML scalar) or env.NAME.")
@click.option("--priority", type=click.IntRange(-1000, 1000), default=0, show_default=True, help="Higher runs first.")
@click.option("--dry-run", is_flag=True, help="Show what would be queued; write nothing.")
@click.option("--force", is_flag=True, help="Queue even jobs that are already queued, running or succeeded.")
@json_option
@plans_option
@db_option
def submit_cmd(
    suite_name: str,
    pairs_text: str,
    round_text: str,
    gpus_text: str | None,
    plan_text: str | None,
    set_items: tuple[str, ...],
    priority: int,
    dry_run: bool,
    force: bool,
    as_json: bool,
    plans_dir: Path | None,
    db_path: Path,
) -> None:
    """Queue SUITE × PAIRS as jobs (idempotent unless --force)."""
    # Parse and validate everything before touching the database.
    pairs = parse_pairs(pairs_text)
    round_selector = parse_round(round_text)
    gpus = parse_gpus(gpus_text) if gpus_text is not None else None
    plan = parse_gpu_plan(plan_text, gpus) if plan_text is not None else None
    suite = load_suite(suite_name, plans_dir or default_plans_dir())
    overrides = parse_set_overrides(set_items, suite.known_keys())

    # Validate the round before anything is created: a bad round must leave no state.db behind.
    stored_plan = None
    if isinstance(round_selector, int) and not suite.rounds and plan is None and db_path.exists():
        with open_store(db_path) as reader:
            stored_plan = get_gpu_plan(reader)
    total_slots = 0
    if isinstance(round_selector, int) and not suite.rounds:
        total_slots = _round_slots(plan, stored_plan, gpus)
    specs = expand_jobs(suite, pairs, overrides, round_selector, total_slots)
    if gpus is not None:
        check_gpus_exist(gpus, db_path, "--gpus")
    if plan is not None and gpus is None:
        check_gpus_exist(sorted(plan.slots_by_gpu), db_path, f"--gpu-plan {shown_value(plan_text or '')}")
    _check_gangs_fit(specs, gpus, db_path)
    check_urls(suite.notify, f"suite {suite.name} notify")
    check_worker_template(suite, specs, overrides)
    note = unreached_rungs_note(suite, specs)

    if dry_run and not db_path.exists():
        outcomes = [SubmitOutcome(spec, None, True, None) for spec in specs]
    else:
        with open_store(db_path, create=True) as store:
            outcomes = submit_jobs(
                store, suite, specs, allowed_gpus=gpus, priority=priority, force=force, dry_run=dry_run
            )
            if plan is not None and not dry_run:
                set_gpu_plan(store, plan)
            if not dry_run:
                set_suite_notify_urls(store, suite.name, suite.notify)
            if not dry_run and any(o.created for o in outcomes):
                changed = worker_changed_since_failure(store, suite.name, suite.worker)
                paused_note = resume_if_changed(store, suite.name, changed)
                note = "\n".join(n for n in (note, paused_note and f"note: {paused_note}") if n) or None

    if note:
        click.echo(note, err=True)
    created = [o for o in outcomes if o.created]
    existing = [o for o in outcomes if not o.created]
    if as_json:
        echo_json(
            {
                "suite": suite.name,
                "dry_run": dry_run,
                "created": len(created),
                "existing": len(existing),
                "gpu_plan": format_plan(plan) if plan else None,
                "jobs": [
                    {
                        "id": o.job_id,
                        "identity": o.spec.identity,
                        "config": o.spec.config_name,
                        "seed": o.spec.seed,
                        "data": o.spec.data,
                        "created": o.created,
                        "state": "queued" if o.created else o.existing_state,
                    }
                    for o in outcomes
                ],
            }
        )
        return
    verb = "would queue" if dry_run else "queued"
    if dry_run:
        for o in created:
            click.echo(f"  {o.spec.config_name}  seed {o.spec.seed}  {o.spec.data}")
    click.echo(f"{verb} {len(created)} job(s) of suite {suite.name}", nl=False)
    if existing:
        states = sorted({o.existing_state or "?" for o in existing})
        click.echo(f"; {len(existing)} already present ({', '.join(states)}; --force to queue again)")
    else:
        click.echo("")
    if plan is not None:
        click.echo(f"GPU plan {'would be set' if dry_run else 'set'}: {describe_plan(plan)}")


def register(group: click.Group) -> None:
    group.add_command(submit_cmd)
