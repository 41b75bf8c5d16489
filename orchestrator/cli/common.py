"""Options and helpers shared by the command modules."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import click

from orchestrator.daemon.database_file import daemon_on_lost_file, last_note
from orchestrator.errors import StoreError, UsageError
from orchestrator.plans import DEFAULT_SLOTS, GpuPlan
from orchestrator.plans.spelling import did_you_mean
from orchestrator.store import Store
from orchestrator.store.queries import suite_names
from orchestrator.wording import one_line

F = TypeVar("F", bound=Callable[..., Any])


def db_option(func: F) -> F:
    return click.option(
        "--db",
        "db_path",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="ORCH_DB",
        default="state.db",
        show_default=True,
        help="State database (env ORCH_DB).",
    )(func)


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON (shapes in docs/results.md).")(func)


def plans_option(func: F) -> F:
    return click.option(
        "--plans",
        "plans_dir",
        type=click.Path(file_okay=False, path_type=Path),
        envvar="ORCH_PLANS",
        default=None,
        help="Directory holding suites/ and configs/ (env ORCH_PLANS; default ./plans, else the shipped plans).",
    )(func)


def open_store(db_path: Path, *, create: bool = False) -> Store:
    """state.db, refused in one line while a daemon still runs on a removed or replaced one;
    a new database made where the last daemon stopped for that reason says so on stderr."""
    lost = daemon_on_lost_file(db_path)
    if lost is not None:
        raise StoreError(lost[1])
    note = last_note(db_path) if create and not Path(db_path).exists() else None
    store = Store(db_path, create=create)
    if note is not None:
        click.echo(f"orch: note: a new state database; the last daemon stopped at {note}", err=True)
    return store


def echo_json(payload: Any) -> None:
    click.echo(json.dumps(payload, indent=2, sort_keys=False, default=str))


def echo_json_stream(items: Iterable[Any], head: dict[str, Any] | None = None, key: str = "") -> None:
    """What `echo_json` prints for `items` as a list (or for `{**head, key: items}`), written
    item by item: the output of a long listing never has to be in memory at once."""
    depth = "  " if head is None else "    "
    if head is not None:
        opening = json.dumps({**head, key: []}, indent=2, sort_keys=False, default=str)
        # the listing is the last member: cut its `[]` and the closing brace
        assert opening.endswith("[]\n}")
        click.echo(opening[: -len("[]\n}")], nl=False)
    empty = True
    for item in items:
        text = json.dumps(item, indent=2, sort_keys=False, default=str)
        click.echo(("[\n" if empty else ",\n") + textwrap.indent(text, depth), nl=False)
        empty = False
    closing = "[]" if empty else "\n" + depth[:-2] + "]"
    click.echo(closing + ("" if head is None else "\n}"))


def parse_job_ids(values: tuple[str, ...]) -> list[int]:
    ids: list[int] = []
    for value in values:
        text = value.strip()
        if not text.isdigit() or len(text) > 12:
            raise UsageError(f"job id {value!r} is not a job number (see `orch jobs`)")
        ids.append(int(text))
    return ids


def fmt_mib(mib: int | float | None) -> str:
    if mib is None:
        return "-"
    return f"{mib / 1024:.1f} GiB"


def describe_plan(plan: GpuPlan) -> str:
    """The plan in words: `GPU 0: 2, GPU 1: 1 jobs at a time; any other GPU: 1`."""
    named = ", ".join(f"GPU {g}: {s}" for g, s in sorted(plan.slots_by_gpu.items()))
    others = plan.default_slots if plan.default_slots is not None else DEFAULT_SLOTS
    if not named:
        return f"at most {others} job(s) at a time on every GPU"
    return f"{named} job(s) at a time; any other GPU: {others}"


def check_gpus_exist(gpus: list[int], db_path: Path, what: str) -> None:
    """Refuse `what` naming a GPU this machine lacks (submit.core.check_gpus_exist)."""
    # the submit path's imports: only where used
    from orchestrator.submit import core as submit_core

    submit_core.check_gpus_exist(gpus, db_path, what, open_store)


def check_suite_known(store: Store, suite: str, db_path: Path) -> None:
    """Refuse a `--suite` this state.db has no job of, naming those it has: a misspelt name
    selected nothing, and `orch cancel --suite` said it cancelled 0 jobs while the sweep ran on."""
    if said := unknown_suite_said(store, suite, db_path):
        raise UsageError(said)


def note_unknown_suite(store: Store, suite: str | None, db_path: Path) -> None:
    """A listing's line on stderr when its `--suite` has no job here: it still lists (nothing),
    since a script may ask before it submits."""
    if suite is not None and (said := unknown_suite_said(store, suite, db_path)):
        click.echo(one_line(f"note: {said}"), err=True)


def unknown_suite_said(store: Store, suite: str, db_path: Path) -> str | None:
    """`unknown suite 'dmeo' in state.db (did you mean 'demo'?) (its suites: demo)`, or None for
    a suite with jobs here. A listing says it beside its empty output (a script may ask before it
    submits); an action refuses (check_suite_known)."""
    known = suite_names(store)
    if suite in known:
        return None
    return (f"unknown suite {suite!r} in {db_path}{did_you_mean([suite], known)} "
            f"(its suites: {', '.join(known) or 'none yet'})")
