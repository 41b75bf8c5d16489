"""Pure rendering of a status snapshot into rich renderables (testable without a terminal)."""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from orchestrator.cli.common import fmt_duration, fmt_mib
from orchestrator.cli.tables import fit_columns
from orchestrator.executors.base import is_cluster_executor
from orchestrator.wording import fmt_changes

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


def host_line(host: dict[str, Any]) -> Text:
    """`host RAM [bar] ours 18.0 GiB, others 1.2 GiB, free 4.8 GiB (2.0 GiB reserved)`."""
    line = Text("host RAM ")
    line.append_text(memory_bar(host["total_mib"], host["ours_mib"], host["others_mib"]))
    line.append(f" ours {fmt_mib(host['ours_mib'])}, others {fmt_mib(host['others_mib'])}, "
                f"free {fmt_mib(host['free_mib'])} ({fmt_mib(host['reserve_mib'])} reserved)")
    return line


RUNNING_COLUMNS = ("job", "config", "seed", "data", "GPU", "att", "lvl", "elapsed", "step", "loss", "mem/pred")
# Dropped first on a narrow terminal: the last of this list first. job, config and GPU stay.
RUNNING_OPTIONAL = ("step", "loss", "elapsed", "lvl", "mem/pred", "data", "att", "seed")


def _where(r: dict[str, Any]) -> str:
    """The GPU index; for an attempt in Slurm, its job id and state (with the pending reason)."""
    if is_cluster_executor(r.get("executor")):
        return f"{r['executor']} {r.get('executor_id') or '?'} {r.get('executor_state') or ''}".strip()
    return str(r["gpu"])


def running_cells(r: dict[str, Any]) -> list[str]:
    progress = r["progress"] or {}
    step = f"{progress.get('step')}/{progress.get('total')}" if progress.get("total") else "-"
    loss = progress.get("loss")
    return [
        str(r["id"]), r["config"], str(r["seed"]), r["data"], _where(r), str(r["attempt"]), str(r["level"]),
        fmt_duration(r["elapsed_s"]), step, "-" if loss is None else f"{loss:.3f}",
        f"{r['held_mib'] / 1024:.1f}/{r['predicted_mib'] / 1024:.1f}G",
    ]


def _running_table(running: list[dict[str, Any]], width: int | None) -> Table:
    cells = [running_cells(r) for r in running]
    columns = list(RUNNING_COLUMNS) if width is None else fit_columns(
        RUNNING_COLUMNS, cells, width - 4, {"config": 32}, RUNNING_OPTIONAL)  # 4: the panel's border
    table = Table(box=None, header_style="bold")
    for column in columns:
        table.add_column(column, no_wrap=column != "config", overflow="fold")
    for row in cells:
        table.add_row(*(row[RUNNING_COLUMNS.index(c)] for c in columns))
    return table


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def _entries(lines: list[str], limit: int) -> list[str]:
    """At most `limit` lines, the last saying how many more there are."""
    if len(lines) <= limit:
        return lines
    kept = max(0, limit - 1)
    return [*lines[:kept], f"... and {len(lines) - kept} more"]


SHRINK_ORDER = ("waiting", "retries", "running", "events")  # the events panel gives way last
SHRINK_FLOORS = {"waiting": 2, "retries": 2, "running": 3, "events": 4}


def next_limits(limits: dict[str, int]) -> dict[str, int] | None:
    """One entry less in the first list that may still give some (to its floor first, then to
    one entry); None when nothing can give. Pure: the dashboard calls it until the frame fits."""
    for floor_of in (lambda name: SHRINK_FLOORS[name], lambda name: 1):
        for name in SHRINK_ORDER:
            if limits[name] > floor_of(name):
                return {**limits, name: limits[name] - 1}
    return None


def one_line(text: str) -> str:
    """Every run of whitespace (the newlines of a long OOM text included) as one space."""
    return " ".join(str(text).split())


def paused_line(p: dict[str, Any]) -> str:
    return (f"suite {p['suite']} paused: {p['reason']} (orch resume {p['suite']})"
            + (f"; {p['queued']} queued job(s) wait for it" if p.get("queued") else ""))


def waiting_entries(snapshot: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The waiting jobs to list, and how many more are queued. A paused suite's jobs are counted
    on its line, not repeated one by one."""
    paused_names = {p["suite"] for p in snapshot["paused_suites"]}
    waiting = [w for w in snapshot["waiting"] if w.get("suite") not in paused_names]
    more = snapshot["counts"]["queued"] - len(waiting) - sum(p.get("queued") or 0 for p in snapshot["paused_suites"])
    return waiting, more


def _height(renderable: RenderableType, width: int) -> int:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    return len(console.render_lines(renderable, console.options, pad=False))


def render_status(snapshot: dict[str, Any], *, width: int | None = None, height: int | None = None) -> RenderableType:
    """The dashboard. With `width`/`height` (a terminal's), columns and list panels are cut to
    fit so nothing runs off the screen (the events panel included); without, everything whole."""
    counts = snapshot["counts"]
    daemon = snapshot["daemon"]
    if daemon["alive"]:
        head = f"daemon pid {daemon['pid']}" + (" [yellow](draining)[/]" if daemon["draining"] else "")
    else:
        db = snapshot.get("db")
        where = f" for {escape(db)}" if db else ""
        head = f"[red]daemon not running[/]{where} (orch daemon start)"
    summary = (
        f"{head}   queued [yellow]{counts['queued']}[/]  running [cyan]{counts['running']}[/]  "
        f"succeeded [green]{counts['succeeded']}[/]  failed [red]{counts['failed']}[/]  "
        f"cancelled [magenta]{counts['cancelled']}[/]"
    )
    clipped = height is not None  # a live frame: one line per entry, cut at the edge

    def text(body: str, style: str = "") -> Text:
        return Text(body, style=style, overflow="ellipsis" if clipped else None, no_wrap=clipped or None)

    paused_lines = [paused_line(p) for p in snapshot["paused_suites"]]
    waiting, more = waiting_entries(snapshot)
    waiting_lines = [f"job {w['id']} {w['config']}: {w['reason'] or 'not yet considered'}" for w in waiting]
    if waiting_lines and more > 0:
        waiting_lines.append(f"... and {more} more queued")
    # one line per entry: a long OOM text's own newlines are spaces here
    retry_lines = [one_line(f"{_clock(r['ts'])} job {r['job']}: {retry_move(r)} ({r['why']})") for r in snapshot["retries"]]
    event_lines = [one_line(f"{_clock(e['ts'])} " + (f"job {e['job']}: " if e["job"] else "") + e["message"])
                   for e in snapshot["events"]]
    running = snapshot["running"]
    full = {"running": len(running), "waiting": len(waiting_lines), "retries": len(retry_lines),
            "events": len(event_lines)}

    def build(limits: dict[str, int]) -> RenderableType:
        return _frame(snapshot, summary, running, paused_lines, waiting_lines, retry_lines, event_lines,
                      limits, width, text)

    frame = build(full)
    if height is None or width is None:
        return frame
    limits: dict[str, int] | None = full
    # Cut the lists until the frame fits (less one line for the cursor), measured as rendered;
    # an entry is at least one line, so each pass cuts as many entries as lines are over.
    excess = _height(frame, width) - (height - 1)
    while limits is not None and excess > 0:
        for _ in range(excess):
            limits = next_limits(limits) if limits is not None else None
        if limits is None:
            break
        frame = build(limits)
        excess = _height(frame, width) - (height - 1)
    return frame


def _frame(
    snapshot: dict[str, Any],
    summary: str,
    running: list[dict[str, Any]],
    paused_lines: list[str],
    waiting_lines: list[str],
    retry_lines: list[str],
    event_lines: list[str],
    limits: dict[str, int],
    width: int | None,
    text: Callable[..., Text],
) -> RenderableType:
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
    if snapshot.get("host"):
        parts.append(host_line(snapshot["host"]))
    if running:
        shown = running if len(running) <= limits["running"] else running[: max(1, limits["running"] - 1)]
        table = _running_table(shown, width)
        if len(shown) < len(running):
            table.add_row(f"+{len(running) - len(shown)}", "more running")
        parts.append(Panel(table, title="running", title_align="left"))
    if paused_lines:
        parts.append(Panel(text("\n".join(paused_lines), style="red"), title="paused", title_align="left"))
    if waiting_lines:
        parts.append(Panel(text("\n".join(_entries(waiting_lines, limits["waiting"]))), title="waiting", title_align="left"))
    if retry_lines:
        # the newest retries first, so a cut list keeps them
        parts.append(Panel(Text("\n".join(_entries(retry_lines, limits["retries"])), overflow="ellipsis", no_wrap=True),
                           title="retries", title_align="left"))
    if event_lines:
        # the newest events are last: a cut list keeps the end
        kept = event_lines[-limits["events"]:] if limits["events"] else []
        parts.append(Panel(Text("\n".join(kept), overflow="ellipsis", no_wrap=True), title="recent events", title_align="left"))
    return Group(*parts)


def retry_move(retry: dict[str, Any]) -> str:
    """`level 0 -> 1`, or the host step a host-RAM OOM took while the level stayed."""
    step = retry.get("host_step")
    if isinstance(step, dict) and retry.get("from_level") == retry.get("to_level"):
        changes = fmt_changes(step.get("changes"))
        alone = "run alone" if step.get("run_alone") else ""
        return f"level {retry['to_level']} + host step {step.get('step')}" + (f": {changes or alone}" if changes or alone else "")
    return f"level {retry['from_level']} -> {retry['to_level']}"
