"""Pure rendering of a status snapshot into rich renderables (testable without a terminal)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from orchestrator.cli.common import fmt_mib
from orchestrator.cli.status.lines import (
    RUNNING_COLUMNS,
    clock,
    one_line,
    paused_lines,
    paused_queued,
    retry_move,
    running_cells,
    setting_names,
    shown_columns,
    slots_cell,
    slots_full,
    waiting_group_lines,
)
from orchestrator.cli.tables import fit_columns

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
        table.add_row(
            f"{g['index']}",
            memory_bar(g["total_mib"], g["orch_mib"], g["foreign_mib"]),
            f"{fmt_mib(g['used_mib'])} / {fmt_mib(g['total_mib'])}",
            fmt_mib(g["free_mib"]),
            Text(slots_cell(g), style="bold" if slots_full(g) else ""),
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


# Dropped first on a narrow terminal: the last of this list first. job, config and GPU stay, and
# the seed is the first kept (at 80 columns the seeds of one config must be told apart), and the
# ladder level goes before the elapsed time and attempt number (a rung changes what is measured).
RUNNING_OPTIONAL = ("seed", "SM", "step", "loss", "data", "lvl", "mem/pred", "shares", "elapsed", "att")


def _running_table(running: list[dict[str, Any]], width: int | None, clipped: bool = False) -> Table:
    """The running jobs; on a live frame one line each (a long config is cut with an ellipsis,
    `orch jobs` has it whole) and every other column whole, so that each job gets its row."""
    names = setting_names(running)
    every = [[one_line(cell) for cell in running_cells(r, names)] for r in running]  # names: user text
    # the setting and SM columns only where a job has one (SM: NVML's per-process figures)
    headers = shown_columns(every)
    cells = [[row[RUNNING_COLUMNS.index(c)] for c in headers] for row in every]
    folded = {"config": 16 if clipped else 32, "setting": 12}
    optional = [c for c in RUNNING_OPTIONAL if c in headers]
    columns = headers if width is None else fit_columns(
        headers, cells, width - 4, folded, optional)  # 4: the panel's border
    natural = {c: max([len(c), *(len(row[headers.index(c)]) for row in cells)]) for c in columns}
    config_width = None
    if clipped and width is not None:
        config_width = max(8, width - 4 - sum(natural[c] + 2 for c in columns if c != "config") - 2)
    table = Table(box=None, header_style="bold")
    for column in columns:
        if column == "setting":  # abbreviated; a long one folds (cut with `…` on a live frame)
            table.add_column(column, no_wrap=clipped, overflow="ellipsis" if clipped else "fold",
                             min_width=min(natural[column], 12))
        elif column == "config":
            table.add_column(
                column,
                no_wrap=clipped,
                overflow="ellipsis" if clipped else "fold",
                max_width=config_width,
            )
        else:
            table.add_column(column, no_wrap=True, min_width=natural[column])
    for row in cells:
        table.add_row(*(row[headers.index(c)] for c in columns))
    return table


def _entries(lines: list[str], limit: int) -> list[str]:
    """At most `limit` lines, the last saying how many more there are."""
    if len(lines) <= limit:
        return lines
    if limit <= 1:  # room for one line: the first entry says more than a count
        return lines[:limit]
    kept = limit - 1
    return [*lines[:kept], f"... and {len(lines) - kept} more"]


# Who gives up rows first when the frame is too tall: the events, then the retries, then the
# waiting reasons; the running jobs claim the rows first and give way last (to one row).
SHRINK_ORDER = ("events", "retries", "waiting", "running")
SHRINK_FLOORS = {"events": 0, "retries": 0, "waiting": 1, "running": 1}


def next_limits(limits: dict[str, int]) -> dict[str, int] | None:
    """One entry less in the first list of SHRINK_ORDER still above its floor; None when nothing
    can give. Pure: the dashboard calls it until the frame fits."""
    for name in SHRINK_ORDER:
        if limits[name] > SHRINK_FLOORS[name]:
            return {**limits, name: limits[name] - 1}
    return None


def grown_limits(limits: dict[str, int], full: dict[str, int]) -> dict[str, int] | None:
    """One entry more in the first list, in the order rows are claimed (running, waiting,
    retries, events), that was cut; None when none was."""
    for name in reversed(SHRINK_ORDER):
        if limits[name] < full[name]:
            return {**limits, name: limits[name] + 1}
    return None


def _height(renderable: RenderableType, width: int) -> int:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    return len(console.render_lines(renderable, console.options, pad=False))


@dataclass(frozen=True)
class Lines:
    """The dashboard's list sections, one line per entry."""

    paused: list[str]
    waiting: list[str]
    retries: list[str]
    events: list[str]


def render_status(snapshot: dict[str, Any], *, width: int | None = None, height: int | None = None) -> RenderableType:
    """The dashboard. With `width`/`height` (a terminal's), columns and list panels are cut to
    fit so nothing runs off the screen: the running jobs claim the rows first, then the waiting
    jobs (one line per reason), the retries and the events; without, everything whole."""
    counts = snapshot["counts"]
    daemon = snapshot["daemon"]
    if daemon["alive"]:
        head = f"daemon pid {daemon['pid']}" + (" [yellow](draining)[/]" if daemon["draining"] else "")
        head += "".join(f" --{mode}" for mode in daemon.get("modes", []))
    else:
        db = snapshot.get("db")
        where = f" for {escape(db)}" if db else ""
        head = f"[red]daemon not running[/]{where} (orch daemon start)"
    summary = (
        f"{head}   queued [yellow]{counts['queued']}[/]  running [cyan]{counts['running']}[/]  "
        f"succeeded [green]{counts['succeeded']}[/]  failed [red]{counts['failed']}[/]  "
        f"cancelled [magenta]{counts['cancelled']}[/]"
        + (f"  pruned [blue]{counts['pruned']}[/]" if counts.get("pruned") else "")
    )
    lines = Lines(
        paused=[one_line(line) for line in paused_lines(snapshot)],
        waiting=waiting_group_lines(snapshot),
        # one line per entry: a long OOM text's own newlines are spaces here
        retries=[
            one_line(f"{clock(r['ts'])} job {r['job']}: {retry_move(r)} ({r['why']})")
            for r in snapshot["retries"]
        ],
        events=[
            one_line(
                f"{clock(e['ts'])} " + (f"job {e['job']}: " if e["job"] else "") + e["message"]
            )
            for e in snapshot["events"]
        ],
    )
    running = snapshot["running"]
    full = {"running": len(running), "waiting": len(lines.waiting), "retries": len(lines.retries),
            "events": len(lines.events)}
    clipped = height is not None  # a live frame: one line per entry, cut at the edge

    def build(limits: dict[str, int]) -> RenderableType:
        return _frame(snapshot, summary, running, lines, limits, width, clipped)

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
    # Cutting by lines over can cut more than needed (a panel that goes takes its borders with
    # it): give entries back, in the order rows are claimed, while the frame still fits.
    while limits is not None and excess <= 0 and (more := grown_limits(limits, full)) is not None:
        bigger = build(more)
        if _height(bigger, width) > height - 1:
            break
        limits, frame = more, bigger
    return frame


def _frame(
    snapshot: dict[str, Any],
    summary: str,
    running: list[dict[str, Any]],
    lines: Lines,
    limits: dict[str, int],
    width: int | None,
    clipped: bool,
) -> RenderableType:
    def text(body: str, style: str = "") -> Text:
        return Text(body, style=style, overflow="ellipsis" if clipped else None, no_wrap=clipped or None)

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
        table: RenderableType = _running_table(shown, width, clipped)
        if len(shown) < len(running):
            table = Group(table, text(f"+{len(running) - len(shown)} more running (orch jobs --state running)"))
        parts.append(Panel(table, title=f"running ({len(running)})", title_align="left"))
    if lines.paused:
        parts.append(Panel(text("\n".join(lines.paused), style="red"), title="paused", title_align="left"))
    if lines.waiting and limits["waiting"]:
        waiting = snapshot["counts"]["queued"] - paused_queued(snapshot)
        parts.append(Panel(text("\n".join(_entries(lines.waiting, limits["waiting"]))), title=f"waiting ({waiting})",
                           title_align="left"))
    if lines.retries and limits["retries"]:
        # the newest retries first, so a cut list keeps them
        parts.append(
            Panel(
                Text(
                    "\n".join(_entries(lines.retries, limits["retries"])),
                    overflow="ellipsis",
                    no_wrap=True,
                ),
                title="retries",
                title_align="left",
            )
        )
    if lines.events and limits["events"]:
        # the newest events are last: a cut list keeps the end
        kept = lines.events[-limits["events"]:]
        parts.append(
            Panel(
                Text("\n".join(kept), overflow="ellipsis", no_wrap=True),
                title="recent events",
                title_align="left",
            )
        )
    return Group(*parts)
