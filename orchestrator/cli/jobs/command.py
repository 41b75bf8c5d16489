"""`orch jobs`, `orch show`, `orch logs`: reading what is in state.db and the run dirs."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator.api.jobs import headline_metric
from orchestrator.attempts.provenance_reads import provenance_line, read_provenance
from orchestrator.cli.common import (
    db_option,
    echo_json,
    echo_json_stream,
    fmt_mib,
    json_option,
    note_unknown_suite,
    open_store,
    parse_job_ids,
)
from orchestrator.cli.jobs.log_stream import TerminalText, copy_from, tail_offset
from orchestrator.cli.jobs.table import STATE_STYLES, jobs_extras, print_jobs
from orchestrator.errors import UsageError
from orchestrator.executors.runs_tree import FileProblem, RunTreeError, open_regular_file
from orchestrator.lifecycle import JobState
from orchestrator.plans.early_stop import EarlyStop
from orchestrator.rundir_files import RunDir
from orchestrator.store.db import Store
from orchestrator.store.job_facts import job_facts
from orchestrator.store.queries import (
    JobListRow,
    get_attempts,
    get_job,
    iter_jobs,
    job_history,
    job_row_to_public,
    job_to_public,
    list_jobs,
)
from orchestrator.wording import attempts_said, fmt_changes, fmt_duration, fmt_settings, one_line


def _ts(value: float | None) -> str:
    return datetime.fromtimestamp(value).strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _with_facts(store: Store, rows: Iterable[JobListRow], chunk: int = 500) -> Iterator[dict[str, Any]]:
    """Each job's public shape with its headline `metric` ({key, value} or null) and `run_s`."""
    batch: list[JobListRow] = []
    for row in itertools.chain(rows, [None]):
        if row is not None:
            batch.append(row)
        if batch and (row is None or len(batch) >= chunk):
            facts = job_facts(store, [r.id for r in batch], store.now_s())
            for r in batch:
                headline = headline_metric(facts[r.id].last_values, r.data)
                yield {
                    **job_row_to_public(r),
                    "metric": {"key": headline[0], "value": headline[1], "attempt": facts[r.id].attempt}
                    if headline else None,
                    "run_s": facts[r.id].run_s,
                }
            batch = []


@click.command("jobs")
@click.option("--state", type=click.Choice([s.value for s in JobState]), default=None, help="Only jobs in this state.")
@click.option("--suite", default=None, help="Only jobs of this suite.")
@click.option("--wide", is_flag=True, help="Never fold or cut a column, however wide the table gets.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many jobs (by id).")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True, help="Skip this many jobs first.")
@json_option
@db_option
def jobs_cmd(
    state: str | None, suite: str | None, wide: bool, limit: int | None, offset: int, as_json: bool, db_path: Path
) -> None:
    """List jobs (piped output: whole values in plain columns)."""
    with open_store(db_path) as store:
        note_unknown_suite(store, suite, db_path)
        if as_json:  # streamed from the cursor: flat memory at any number of jobs
            echo_json_stream(_with_facts(store, iter_jobs(store, state=state, suite=suite, limit=limit, offset=offset)))
            return
        rows = list_jobs(store, state=state, suite=suite, limit=limit, offset=offset)
        facts = job_facts(store, [r.id for r in rows], store.now_s())
        extras = jobs_extras(facts, {r.id: r.data for r in rows}, {r.id: r.attempt_count for r in rows})
    print_jobs(rows, wide=wide, extras=extras)
    if not rows:
        click.echo("no jobs" + (" matching" if state or suite else " (orch submit --suite ... --pairs ...)"))


@click.command("show")
@click.argument("job")
@json_option
@db_option
def show_cmd(job: str, as_json: bool, db_path: Path) -> None:
    """One job with every attempt and its history."""
    (job_id,) = parse_job_ids((job,))
    with open_store(db_path) as store:
        payload = job_to_public(job_history(store, job_id))
    for a in payload["attempts"]:  # a running attempt's is stored at its end: read it as it is now
        if a["provenance"] is None and a["outcome"] is None:
            a["provenance"] = read_provenance(Path(a["run_dir"]), None)
    if as_json:
        echo_json(payload)
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=100_000)  # piped: lines are never cut or wrapped

    def say(line: str) -> None:  # a line of user text (settings, reasons, notes, events): as one_line shows it
        console.print(one_line(line), markup=False, highlight=False)

    style = STATE_STYLES.get(payload["state"], "")
    console.print(
        f"[bold]job {payload['id']}[/]  [{style}]{payload['state']}[/]  "
        + escape(one_line(f"{payload['suite']}/{payload['config']}  seed {payload['seed']}  {payload['data']}"))
    )
    say(f"  worker: {payload['worker']}   config: {payload['config_path']}")
    console.print(
        f"  level {payload['level']}, "
        + attempts_said(payload["attempt"], payload["counted_attempts"], payload["max_attempts"],
                        payload["resumes"], payload["max_resumes"])
        + f", priority {payload['priority']}, declared {fmt_mib(payload['declared_mib'])}"
        + (f", GPUs {payload['allowed_gpus']}" if payload["allowed_gpus"] is not None else "")
    )
    if payload["level_note"]:
        say(f"  {payload['level_note']}")
    if payload["overrides"]:
        # a search trial's values were drawn by the search, not given with --set
        given = "--set" if payload.get("trial") is None else f"search trial {payload['trial']}:"
        say(f"  {given} {fmt_settings(payload['overrides'])}")
    rule = EarlyStop.from_json(payload.get("early_stop") or {})
    if rule is not None:
        say(f"  early_stop: {rule.words()}")
    if payload["wait_reason"] and payload["state"] == "queued":
        say(f"  waiting: {payload['wait_reason']}")
    if payload["reason"]:
        say(f"  reason: {payload['reason']}")
    if payload["attempts"]:
        table = Table(title="attempts", box=None, header_style="bold", title_justify="left")
        # A narrow terminal folds the level's name; numbers and dates are never cut or broken.
        for column in ("n", "GPU", "level", "predicted", "peak", "outcome", "exit", "started", "took"):
            table.add_column(column, overflow="fold", no_wrap=column != "level")
        for a in payload["attempts"]:
            took = fmt_duration(a["ended_at"] - a["started_at"]) if a["ended_at"] else "-"
            table.add_row(
                str(a["n"]), str(a["gpu"]), one_line(f"{a['level']} {a['step'] or ''}".strip()),
                fmt_mib(a["predicted_peak_mib"]), fmt_mib(a["peak_mib"]),
                a["outcome"] or "running", "-" if a["exit_code"] is None else str(a["exit_code"]),
                _ts(a["started_at"]), took,
            )
        console.print(table)
        for a in payload["attempts"]:
            changes = fmt_changes(a["changes"], bool(a["run_alone"]))
            predicted = f"predicted from {a['prediction_source']}" if a["prediction_source"] else ""
            if a.get("trial_fence_mib") is not None:  # placed into less room than its prediction
                predicted += f"; started on trial in {fmt_mib(a['trial_fence_mib'])}, its MPS fence"
            resumed = a["resumed_from"]
            resumed_text = (
                f"resumed from attempt {resumed['attempt']}'s checkpoint {resumed['checkpoint']}"
                if resumed
                else ""
            )
            share = a.get("share")
            shared = f"trained in {share['mode']} warm process {share['process']} (pid {share['pid']})" if share else ""
            if a.get("fuse_process") is not None:  # where the daemon placed it: the attempt that opened the process
                placed = f"placed in fused process {a['fuse_process']}"
                shared = f"{placed}, {shared}" if shared else placed
            notes = [resumed_text, predicted, shared, f"changed {changes}" if changes else "", a["reason"] or "",
                     a.get("hunted") or "", f"loss diverged: {a['diverged']}" if a.get("diverged") else ""]
            shown = "; ".join(n for n in notes if n)
            if shown:
                say(f"  attempt {a['n']}: {shown}")
            if a["provenance"]:
                say(f"  attempt {a['n']} ran with: {provenance_line(a['provenance'])}")
        say(f"  run dir: {payload['attempts'][-1]['run_dir']}")
    console.print("[bold]history[/]")
    for e in payload["events"]:
        say(f"  {_ts(e['ts'])}  {e['message']}")


@click.command("logs")
@click.argument("job")
@click.option("--attempt", "attempt_n", type=int, default=None, help="Attempt number (default: the latest).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the log grows, until the attempt ends.")
@click.option("--tail", "tail_lines", type=click.IntRange(min=1), default=None, help="Only the last N lines (N >= 1).")
@click.option("--raw", is_flag=True, help="The bytes as the worker wrote them, terminal control sequences included.")
@db_option
def logs_cmd(job: str, attempt_n: int | None, follow: bool, tail_lines: int | None, raw: bool, db_path: Path) -> None:
    """Print an attempt's stdout.log (in blocks: any size, little memory). Control sequences
    the worker printed (titles, clipboard writes, cursor moves) are left out, colours kept."""
    (job_id,) = parse_job_ids((job,))
    with open_store(db_path) as store:
        get_job(store, job_id)
        attempts = get_attempts(store, job_id)
    if not attempts:
        raise UsageError(f"job {job_id} has not started yet (no attempt, so no log)")
    chosen = attempts[-1] if attempt_n is None else next((a for a in attempts if a.n == attempt_n), None)
    if chosen is None:
        raise UsageError(f"job {job_id} has no attempt {attempt_n} (it has {len(attempts)})")
    files = RunDir(chosen.run_dir)
    log_path = files.log
    try:  # user code writes in the run dir: no link followed, no FIFO read
        fd = open_regular_file(files.path, RunDir.LOG)
    except FileNotFoundError:
        raise UsageError(f"no log yet at {log_path}") from None
    except (FileProblem, RunTreeError) as exc:
        raise UsageError(f"cannot show {log_path}: {exc}") from None
    out = click.get_binary_stream("stdout")  # type: ignore[operator]  # (click types the lookup loosely)
    cleaner = None if raw else TerminalText()

    def write(block: bytes) -> None:
        out.write(block if cleaner is None else cleaner.feed(block).encode("utf-8", errors="replace"))
        out.flush()

    try:
        offset = copy_from(fd, tail_offset(fd, tail_lines) if tail_lines is not None else 0, write)
        exit_record = files.exit
        while follow:
            grown = copy_from(fd, offset, write)
            if grown == offset and exit_record.exists():
                offset = copy_from(fd, offset, write)  # what came with the end
                break
            if grown == offset:
                time.sleep(0.3)  # following a file: poll its growth
            offset = grown
        if cleaner is not None:
            out.write(cleaner.feed(b"", final=True).encode("utf-8", errors="replace"))
    finally:
        os.close(fd)


def register(group: click.Group) -> None:
    group.add_command(jobs_cmd)
    group.add_command(show_cmd)
    group.add_command(logs_cmd)

