"""`orch plan show|set`: the per-GPU concurrency caps the daemon packs under."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.common import (
    check_gpus_exist,
    db_option,
    describe_plan,
    echo_json,
    json_option,
    open_store,
)
from orchestrator.plans import DEFAULT_SLOTS, parse_gpu_plan, parse_gpus
from orchestrator.plans.inputs import shown_value
from orchestrator.store.jobs import get_gpu_plan, set_gpu_plan


@click.group("plan")
def plan_group() -> None:
    """Show or set the per-GPU concurrency plan."""


@plan_group.command("show")
@json_option
@db_option
def plan_show(as_json: bool, db_path: Path) -> None:
    """Show the stored plan."""
    with open_store(db_path) as store:  # a read: never creates a database
        plan = get_gpu_plan(store)
    if as_json:
        echo_json(
            {
                "gpus": {str(k): v for k, v in sorted(plan.slots_by_gpu.items())},
                "default_slots": plan.default_slots if plan.default_slots is not None else DEFAULT_SLOTS,
            }
        )
        return
    click.echo(f"GPU plan: {describe_plan(plan)}")


@plan_group.command("set")
@click.argument("plan_text", metavar="PLAN")
@click.option("--gpus", "gpus_text", default=None, help='GPUs the plan entries refer to, e.g. "0 1 2".')
@json_option
@db_option
def plan_set(plan_text: str, gpus_text: str | None, as_json: bool, db_path: Path) -> None:
    """Set caps: PLAN is "2,2,1" (one per GPU) or a single number for every GPU.
    It replaces the stored plan whole: a GPU it does not name runs 1 job at a time."""
    gpus = parse_gpus(gpus_text) if gpus_text is not None else None
    plan = parse_gpu_plan(plan_text, gpus, "PLAN", allow_all_zero=gpus is not None)
    if gpus is not None:
        check_gpus_exist(gpus, db_path, "--gpus")
    else:
        check_gpus_exist(sorted(plan.slots_by_gpu), db_path, f"PLAN {shown_value(plan_text)}")
    with open_store(db_path, create=True) as store:
        set_gpu_plan(store, plan)
        stored = get_gpu_plan(store)
    if as_json:
        echo_json(
            {
                "gpus": {str(k): v for k, v in sorted(stored.slots_by_gpu.items())},
                "default_slots": stored.default_slots,
            }
        )
        return
    click.echo(f"GPU plan set: {describe_plan(stored)}")


def register(group: click.Group) -> None:
    group.add_command(plan_group)
