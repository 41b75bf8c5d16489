"""`orch status` (live dashboard) and `orch gpus` (live readings)."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path

import click
from rich.console import Console, RenderableType
from rich.live import Live

from orchestrator.api.status_snapshot import status_snapshot
from orchestrator.cli.common import (
    db_option,
    echo_json,
    echo_json_stream,
    fmt_mib,
    json_option,
    open_store,
)
from orchestrator.cli.status.plain import plain_status
from orchestrator.cli.status.rich_view import render_status
from orchestrator.errors import GpuUnavailable
from orchestrator.store.db import now_s
from orchestrator.store.queries import iter_status_jobs
from orchestrator.store.status import daemon_reading
from orchestrator.wording import fmt_duration


@click.command("status")
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option(
    "--interval",
    "interval_s",
    type=click.FloatRange(0.2, 60.0),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes of the live dashboard.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="--json: at most this many jobs in `jobs` (by id).",
)
@click.option(
    "--offset",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="--json: skip this many jobs first.",
)
@json_option
@db_option
def status_cmd(
    once: bool, interval_s: float, limit: int | None, offset: int, as_json: bool, db_path: Path
) -> None:
    """Live dashboard: GPUs, running jobs, waiting reasons, retries, events."""
    with open_store(db_path) as store:  # a read: never creates a database
        if as_json:  # `jobs` streamed from the cursor: flat memory at any number of jobs
            head = status_snapshot(store, all_jobs=False)
            del head["jobs"]
            echo_json_stream(iter_status_jobs(store, limit=limit, offset=offset), head, "jobs")
            return
        console = Console()
        if not console.is_terminal:  # piped: plain columns, nothing cut, no boxes
            click.echo(plain_status(status_snapshot(store, all_jobs=False)), nl=False)
            return
        if once:
            console.print(render_status(status_snapshot(store, all_jobs=False), width=console.width))
            return

        def frame() -> RenderableType:
            # sized to the terminal now, so a resize is followed and the events stay on screen
            return render_status(status_snapshot(store, all_jobs=False), width=console.width, height=console.height)

        with Live(frame(), console=console, screen=False, refresh_per_second=4, transient=False) as live:
            try:
                while True:
                    time.sleep(interval_s)  # the dashboard's refresh interval
                    live.update(frame())
            except KeyboardInterrupt:
                pass


@click.command("gpus")
@click.option("--backend", type=click.Choice(["nvml", "sim"]), default=None,
              help="GPU backend (env ORCH_GPU_BACKEND; default NVML).")
@json_option
@db_option
def gpus_cmd(backend: str | None, as_json: bool, db_path: Path) -> None:
    """Read the GPUs now (NVML, or the simulated backend); without either here, the daemon's
    last reading from the database (as `orch status` shows it)."""
    from orchestrator.cli.daemon.setup import resolve_backend

    try:
        probe, _ = resolve_backend(db_path, backend)
        try:
            gpus = [asdict(s) for s in probe.snapshot()]
        finally:
            probe.close()
    except GpuUnavailable as exc:
        named = backend or os.environ.get("ORCH_GPU_BACKEND")
        reading = None
        if not named and db_path.exists():
            with open_store(db_path) as store:
                reading = daemon_reading(store)
        if reading is None or not reading.gpus:
            raise
        age = "" if reading.heartbeat_at is None else f", {fmt_duration(now_s() - reading.heartbeat_at)} ago"
        click.echo(f"note: {' '.join(str(exc).split())}; showing the daemon's last reading{age} from {db_path}",
                   err=True)
        gpus = reading.gpus
    if as_json:
        echo_json(gpus)
        return
    for s in gpus:
        util = "" if s.get("utilization_pct") is None else f", {s['utilization_pct']}% busy"
        click.echo(f"GPU {s['index']}  {s['name']}  {fmt_mib(s['used_mib'])} used / {fmt_mib(s['total_mib'])}, "
                   f"{fmt_mib(s['free_mib'])} free{util}  {s['uuid']}")
        for p in s.get("processes") or []:
            sm = "" if p.get("sm_pct") is None else f", {p['sm_pct']}% of the SMs"
            click.echo(f"    pid {p['pid']}: {fmt_mib(p['used_mib'])}{sm}")


def register(group: click.Group) -> None:
    group.add_command(status_cmd)
    group.add_command(gpus_cmd)
