"""`orch curves`: every metric the chosen jobs reported, as tidy rows (job, attempt, step, key,
value) in CSV or JSON (orchestrator.api.curves)."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.api.curves import as_csv, as_json, curve_points
from orchestrator.cli.common import db_option, note_unknown_suite, open_store
from orchestrator.errors import JobNotFound, UsageError
from orchestrator.plans.inputs import SUITE_NAME_RE, shown_value
from orchestrator.store.history import selection_keys
from orchestrator.store.job_facts import job_states


@click.command("curves")
@click.option(
    "--job",
    "job_ids",
    type=click.IntRange(1),
    multiple=True,
    metavar="N",
    help="A job (repeatable); default every job.",
)
@click.option("--suite", "suite", default=None, help="Only jobs of this suite.")
@click.option(
    "--key", "keys", multiple=True, metavar="KEY", help="Only this metric (repeatable), e.g. loss."
)
@click.option(
    "--stitch",
    is_flag=True,
    help="One curve per job: a later attempt wins from its first step (a resumed job reads whole).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["csv", "json"]),
    default="csv",
    show_default=True,
    help="csv: a header and a row per point; json: a list of row objects.",
)
@db_option
def curves_cmd(
    job_ids: tuple[int, ...],
    suite: str | None,
    keys: tuple[str, ...],
    stitch: bool,
    fmt: str,
    db_path: Path,
) -> None:
    """Print the metric history of jobs: job, attempt, step, key, value."""
    if suite is not None and not SUITE_NAME_RE.fullmatch(suite):
        raise UsageError(f"--suite {shown_value(suite)} is not a suite name")
    with open_store(db_path) as store:
        note_unknown_suite(store, suite, db_path)
        missing = sorted(set(job_ids) - set(job_states(store, list(job_ids))))
        if missing:
            raise JobNotFound(f"no job {missing[0]} (see `orch jobs`)")
        if keys:
            known = selection_keys(store, jobs=list(job_ids) or None, suite=suite)
            unknown = [key for key in keys if key not in known]
            if known and unknown:
                raise UsageError(f"--key {shown_value(unknown[0])}: no such metric in the chosen jobs' history "
                                 f"(known: {', '.join(known)})")
        points = curve_points(store, jobs=list(job_ids) or None, suite=suite, keys=list(keys) or None, stitched=stitch)
    click.echo(as_csv(points) if fmt == "csv" else as_json(points), nl=fmt == "json")


def register(group: click.Group) -> None:
    group.add_command(curves_cmd)
