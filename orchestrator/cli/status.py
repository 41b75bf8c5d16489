"""`orch status` (live dashboard) and `orch gpus` (live readings)."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import click
from rich.console import Console, RenderableType
from rich.live import Live

from orchestrator.cli.common import db_option, echo_json, fmt_mib, json_option, open_store
from orchestrator.cli.render import render_status
from orchestrator.cli.status_query import status_snapshot
from orchestrator.cli.tables import print_whole


@click.command("status")
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option("--interval", "interval_s", type=click.FloatRange(0.2, 60.0), default=1.0, show_default=True,
              help="Seconds between refreshes of the live dashboard.")
@json_option
@db_option
def status_cmd(once: bool, interval_s: float, as_json: bool, db_path: Path) -> None:
    """Live dashboard: GPUs, running jobs, waiting reasons, retries, events."""
    with open_store(db_path) as store:  # a read: never creates a database
        if as_json:
            echo_json(status_snapshot(store))
            return
        console = Console()
        if not console.is_terminal:
            print_whole(render_status(status_snapshot(store, all_jobs=False)), console)  # piped: nothing cut
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
    """Read the GPUs now (NVML, or the simulated backend)."""
    from orchestrator.cli.daemon_cmd import resolve_backend

    probe, _ = resolve_backend(db_path, backend)
    try:
        snapshots = probe.snapshot()
    finally:
        probe.close()
    if as_json:
        echo_json([asdict(s) for s in snapshots])
        return
    for s in snapshots:
        util = "" if s.utilization_pct is None else f", {s.utilization_pct}% busy"
        click.echo(f"GPU {s.index}  {s.name}  {fmt_mib(s.used_mib)} used / {fmt_mib(s.total_mib)}, {fmt_mib(s.free_mib)} free{util}  {s.uuid}")
        for p in s.processes:
            click.echo(f"    pid {p.pid}: {fmt_mib(p.used_mib)}")


def register(group: click.Group) -> None:
    group.add_command(status_cmd)
    group.add_command(gpus_cmd)
