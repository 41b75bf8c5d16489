"""`orch submit`: expand a suite × grid × pairs into jobs and queue them, idempotently
(orchestrator.submit.core does the work; this prints it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import click

from orchestrator.cli.common import (
    db_option,
    describe_plan,
    echo_json,
    json_option,
    open_store,
    plans_option,
)
from orchestrator.plans.model import ShareBase
from orchestrator.store.jobs import format_plan
from orchestrator.submit.core import SubmitRequest, submit_sweep


def _shown(overrides: Mapping[str, object], grid: Mapping[str, object]) -> str:
    return "  ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in overrides.items() if k in grid)


@click.command("submit")
@click.option("--suite", "suite_name", required=True, help="Suite name (plans/suites/NAME.yaml).")
@click.option(
    "--pairs",
    "pairs_text",
    default=None,
    help='SEED:DATA pairs, e.g. "87:glue-tvt_qnli 127:glue-tvt_rte" (default: the suite\'s seeds × tasks).',
)
@click.option(
    "--seeds",
    "seeds_text",
    default=None,
    help='Seeds, e.g. "1-3" or "1 2 3": each × the suite\'s tasks, '
    "or alone for a script without tasks.",
)
@click.option(
    "--config",
    "config_names",
    multiple=True,
    metavar="NAME",
    help="Only this config of the suite (repeatable; default: all of them).",
)
@click.option(
    "--round",
    "round_text",
    default="all",
    show_default=True,
    help="all, a round number (1-based) or a named round.",
)
@click.option(
    "--gpus", "gpus_text", default=None, help='Restrict these jobs to GPUs, e.g. "0 1 2 3".'
)
@click.option(
    "--gpu-plan",
    "plan_text",
    default=None,
    help='Per-GPU concurrency caps, e.g. "2,2,1" (stored for the daemon).',
)
@click.option(
    "--set",
    "set_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config key (typed as the config holds it) or env.NAME; each key once.",
)
@click.option(
    "--grid",
    "grid_items",
    multiple=True,
    metavar="KEY=V1,V2",
    help="Queue one job per value (repeatable: the Cartesian product with configs × pairs).",
)
@click.option(
    "--priority",
    type=click.IntRange(-1000, 1000),
    default=0,
    show_default=True,
    help="Higher runs first.",
)
@click.option("--dry-run", is_flag=True, help="Show what would be queued; write nothing.")
@click.option(
    "--force", is_flag=True, help="Queue even jobs that are already queued, running, succeeded or pruned."
)
@click.option(
    "--strict-ladder",
    is_flag=True,
    help="Exact ladder rungs only: no retry changes the numbers (no half batch); a job no exact rung fits fails.",
)
@json_option
@plans_option
@db_option
def submit_cmd(
    suite_name: str,
    pairs_text: str | None,
    seeds_text: str | None,
    config_names: tuple[str, ...],
    round_text: str,
    gpus_text: str | None,
    plan_text: str | None,
    set_items: tuple[str, ...],
    grid_items: tuple[str, ...],
    priority: int,
    dry_run: bool,
    force: bool,
    strict_ladder: bool,
    as_json: bool,
    plans_dir: Path | None,
    db_path: Path,
) -> None:
    """Queue SUITE × GRID × PAIRS as jobs (idempotent unless --force)."""
    request = SubmitRequest(suite_name, pairs_text, set_items, grid_items, round_text, gpus_text, plan_text,
                            priority, dry_run, force, strict_ladder, seeds=seeds_text, configs=config_names)
    report = submit_sweep(request, db_path, plans_dir, open_store)
    for note in report.notes:
        click.echo(note, err=True)
    created, existing, plan = report.created, report.existing, report.plan
    if as_json:
        echo_json(
            {
                "suite": report.suite.name,
                "dry_run": dry_run,
                "created": len(created),
                "existing": len(existing),
                "gpu_plan": format_plan(plan) if plan else None,
                "grid": report.grid,
                "early_stop": report.suite.early_stop.to_json() if report.suite.early_stop else None,
                "jobs": [
                    {
                        "id": o.job_id,
                        "identity": o.spec.identity,
                        "config": o.spec.config_name,
                        "seed": o.spec.seed,
                        "data": o.spec.data,
                        "overrides": o.spec.overrides,
                        "trial": o.spec.trial,  # a search's trial number; null outside a search
                        "created": o.created,
                        "state": o.state_said(dry_run),
                    }
                    for o in report.outcomes
                ],
            }
        )
        return
    verb = "would queue" if dry_run else "queued"
    if dry_run:
        for o in created:
            task = f"  {o.spec.data}" if o.spec.data else ""
            trial = f"  trial {o.spec.trial}" if o.spec.trial is not None else ""  # queued shuffled with early_stop
            shown = _shown(o.spec.overrides, report.grid)
            pruned = "  (would end pruned at once)" if o.pruned_at_once else ""  # its setting was stopped
            click.echo(f"  {o.spec.config_name}  seed {o.spec.seed}{task}{trial}  {shown}".rstrip() + pruned)
    click.echo(f"{verb} {len(created)} job(s) of suite {report.suite.name}", nl=False)
    if existing:
        states = sorted({o.existing_state or "?" for o in existing})
        again = "--force to queue again" + ("; `orch retry JOB` resumes a pruned one" if "pruned" in states else "")
        click.echo(f"; {len(existing)} already present ({', '.join(states)}; {again})")
    else:
        click.echo("")
    if report.suite.early_stop is not None and created:
        click.echo(f"early_stop: {report.suite.early_stop.words()}")
    if report.suite.share_base is not ShareBase.OFF and created:
        click.echo(f"share_base: {share_base_words(report.suite.share_base, report.suite.fused_members)}")
    if plan is not None:
        click.echo(f"GPU plan {'would be set' if dry_run else 'set'}: {describe_plan(plan)}")


def share_base_words(mode: ShareBase, fused_members: int) -> str:
    """How the suite's jobs will share a loaded base, said where they are queued."""
    if mode is ShareBase.SEQUENTIAL:
        return ("sequential: a warm LoRA worker process per card slot and base trains its jobs one after "
                "another (numbers bit-equal to a process of their own)")
    return (f"fused: up to {fused_members} jobs of one base train at once in a process, those of one adapter "
            "spec and batch size together first; their results are marked ⊕ (not bit-equal to a run alone)")


def register(group: click.Group) -> None:
    group.add_command(submit_cmd)
