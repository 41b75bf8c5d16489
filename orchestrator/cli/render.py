"""Pure rendering of a status snapshot into rich renderables (testable without a terminal)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from orchestrator.cli.common import fmt_duration, fmt_mib

BAR_WIDTH = 24


def memory_bar(total_mib: int, orch_mib: int, foreign_mib: int) -> Text:
    """[orch|foreign|free] as coloured blocks."""
    if total_mib <= 0:
        return Text("")
    orch_cells = round(BAR_WIDTH * orch_mib / total_mib)
    foreign_cells = min(BAR_WIDTH - orch_cells, round(BAR_WIDTH * foreign_mib / total_mib))
    free_cells = max(0, BAR_WIDTH - orch_cells - foreign_cells)
    bar = Text()
    bar.append("█" * orch_cells, style="cyan")
    bar.append("█" * foreign_cells, style="red")
    bar.append("░" * free_cells, style="grey50")
    return bar


def _gpu_table(snapshot: dict[str, Any]) -> Table:
    table = Table(box=None, header_style="bold", expand=False)
    for column in ("GPU", "memory (orch/foreign/free)", "used", "free", "slots", "util"):
        table.add_column(column)
    for g in snapshot["gpus"]:
        slots = f"{g['running']}/{g['slots']}"
        table.add_row(
            f"{g['index']}",
            memory_bar(g["total_mib"], g["orch_mib"], g["foreign_mib"]),
            f"{fmt_mib(g['used_mib'])} / {fmt_mib(g['total_mib'])}",
            fmt_mib(g["free_mib"]),
            Text(slots, style="bold" if g["running"] >= g["slots"] > 0 else ""),
            "-" if g["utilization_pct"] is None else f"{g['utilization_pct']}%",
        )
    return table


def _running_table(snapshot: dict[str, Any]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("job", "config", "seed", "data", "GPU", "att", "lvl", "elapsed", "step", "loss", "mem/pred"):
        table.add_column(column, no_wrap=True, overflow="ellipsis", min_width=4 if column in ("config", "data") else None)
    for r in snapshot["running"]:
        progress = r["progress"] or {}
        step = f"{progress.get('step')}/{progress.get('total')}" if progress.get("total") else "-"
        loss = progress.get("loss")
        table.add_row(
            str(r["id"]), r["config"], str(r["seed"]), r["data"], str(r["gpu"]), str(r["attempt"]), str(r["level"]),
            fmt_duration(r["elapsed_s"]), step, "-" if loss is None else f"{loss:.3f}",
            f"{r['held_mib'] / 1024:.1f}/{r['predicted_mib'] / 1024:.1f}G",
        )
    return table


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def render_status(snapshot: dict[str, Any]) -> RenderableType:
    counts = snapshot["counts"]
    daemon = snapshot["daemon"]
    if daemon["alive"]:
        head = f"daemon pid {daemon['pid']}" + (" [yellow](draining)[/]" if daemon["draining"] else "")
    else:
        head = "[red]daemon not running[/] (orch daemon start)"
    summary = (
        f"{head}   queued [yellow]{counts['queued']}[/]  running [cyan]{counts['running']}[/]  "
        f"succeeded [green]{counts['succeeded']}[/]  failed [red]{counts['failed']}[/]  "
        f"cancelled [magenta]{counts['cancelled']}[/]"
    )
    parts: list[RenderableType] = [Text.from_markup(summary)]
    disk = snapshot.get("disk")
    if disk and disk.get("level") in ("full", "low"):
        if disk["level"] == "full":
            line = (f"disk full: {disk['path']} has {disk['free_mib']} MiB free; nothing starts until "
                    f"{disk['min_free_mib']} MiB are free")
        else:
            line = f"disk space low: {disk['path']} has {disk['free_mib']} MiB free"
        parts.append(Text(line, style="red" if disk["level"] == "full" else "yellow"))
    if snapshot["gpus"]:
        parts.append(Panel(_gpu_table(snapshot), title="GPUs", title_align="left"))
    if snapshot["running"]:
        parts.append(Panel(_running_table(snapshot), title="running", title_align="left"))
    if snapshot["paused_suites"]:
        paused = "\n".join(f"suite {p['suite']} paused: {p['reason']} (orch resume {p['suite']})" for p in snapshot["paused_suites"])
        parts.append(Panel(Text(paused, style="red"), title="paused", title_align="left"))
    if snapshot["waiting"]:
        lines = [f"job {w['id']} {w['config']}: {w['reason'] or 'not yet considered'}" for w in snapshot["waiting"]]
        more = counts["queued"] - len(snapshot["waiting"])
        if more > 0:
            lines.append(f"... and {more} more queued")
        parts.append(Panel(Text("\n".join(lines)), title="waiting", title_align="left"))
    if snapshot["retries"]:
        lines = [f"{_clock(r['ts'])} job {r['job']}: {_retry_move(r)} ({r['why']})" for r in snapshot["retries"]]
        parts.append(Panel(Text("\n".join(lines), overflow="ellipsis", no_wrap=True), title="retries", title_align="left"))
    if snapshot["events"]:
        lines = [f"{_clock(e['ts'])} " + (f"job {e['job']}: " if e["job"] else "") + e["message"] for e in snapshot["events"]]
        parts.append(Panel(Text("\n".join(lines), overflow="ellipsis", no_wrap=True), title="recent events", title_align="left"))
    return Group(*parts)


def _retry_move(retry: dict[str, Any]) -> str:
    """`level 0 -> 1`, or the host step a host-RAM OOM took while the level stayed."""
    step = retry.get("host_step")
    if isinstance(step, dict) and retry.get("from_level") == retry.get("to_level"):
        changes = ", ".join(f"{k}={v}" for k, v in (step.get("changes") or {}).items())
        alone = "run alone" if step.get("run_alone") else ""
        return f"level {retry['to_level']} + host step {step.get('step')}" + (f": {changes or alone}" if changes or alone else "")
    return f"level {retry['from_level']} -> {retry['to_level']}"
