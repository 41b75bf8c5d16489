"""`orch status --once` piped or redirected: the dashboard as plain text, section by section,
every value whole in aligned columns and one line per entry, no boxes or colours. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from orchestrator.cli.common import fmt_mib
from orchestrator.cli.status.lines import (
    NOT_CONSIDERED,
    RUNNING_COLUMNS,
    one_line,
    paused_lines,
    retry_move,
    running_cells,
    setting_cell,
    shown_columns,
    slots_cell,
    waiting_entries,
)
from orchestrator.cli.tables import plain_columns


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def _section(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return f"\n{title}\n" + plain_columns(headers, [[one_line(c) for c in row] for row in rows])


def _summary(snapshot: dict[str, Any]) -> str:
    daemon, counts = snapshot["daemon"], snapshot["counts"]
    if daemon["alive"]:
        head = f"daemon pid {daemon['pid']}" + (" (draining)" if daemon["draining"] else "")
        head += "".join(f" --{mode}" for mode in daemon.get("modes", []))
    else:
        head = "daemon not running" + (f" for {snapshot['db']}" if snapshot.get("db") else "") + " (orch daemon start)"
    return (f"{head}   queued {counts['queued']}  running {counts['running']}  succeeded {counts['succeeded']}  "
            f"failed {counts['failed']}  cancelled {counts['cancelled']}"
            + (f"  pruned {counts['pruned']}" if counts.get("pruned") else "") + "\n")


def plain_status(snapshot: dict[str, Any]) -> str:
    """The status snapshot as plain text for a pipe (`orch status --once | grep ...`)."""
    out = [_summary(snapshot)]
    disk = snapshot.get("disk")
    if disk and disk.get("level") in ("full", "low"):
        out.append(f"disk {disk['level']}: {disk['path']} has {disk['free_mib']} MiB free "
                   f"(nothing starts below {disk['min_free_mib']} MiB)\n")
    if snapshot["gpus"]:
        out.append(_section("GPUs", ("GPU", "name", "used", "total", "orch", "foreign", "free", "slots", "util"), [
            [str(g["index"]), g["name"], fmt_mib(g["used_mib"]), fmt_mib(g["total_mib"]), fmt_mib(g["orch_mib"]),
             fmt_mib(g["foreign_mib"]), fmt_mib(g["free_mib"]), slots_cell(g),
             "-" if g["utilization_pct"] is None else f"{g['utilization_pct']}%"]
            for g in snapshot["gpus"]]))
    host = snapshot.get("host")
    if host:
        out.append(f"\nhost RAM: ours {fmt_mib(host['ours_mib'])}, others {fmt_mib(host['others_mib'])}, "
                   f"free {fmt_mib(host['free_mib'])} ({fmt_mib(host['reserve_mib'])} reserved)\n")
    if snapshot["running"]:
        every = [running_cells(r) for r in snapshot["running"]]
        columns = shown_columns(every, ("shares",))  # the others always, as before
        out.append(_section("running", columns, [[row[RUNNING_COLUMNS.index(c)] for c in columns] for row in every]))
    paused = paused_lines(snapshot)
    if paused:
        out.append("\npaused\n" + "".join(one_line(line) + "\n" for line in paused))
    waiting, more = waiting_entries(snapshot)
    if waiting:
        rows = [[str(w["id"]), w["config"], setting_cell(w), str(w.get("seed", "-")),
                 w["reason"] or NOT_CONSIDERED] for w in waiting]
        out.append(_section("waiting", ("job", "config", "setting", "seed", "reason"), rows))
        if more > 0:
            out.append(f"... and {more} more queued\n")
    if snapshot["retries"]:
        out.append(_section("retries", ("time", "job", "move", "why"), [
            [_clock(r["ts"]), str(r["job"]), retry_move(r), str(r.get("why") or "")] for r in snapshot["retries"]]))
    if snapshot["events"]:
        out.append(_section("recent events", ("time", "job", "message"), [
            [_clock(e["ts"]), str(e["job"] or "-"), e["message"]] for e in snapshot["events"]]))
    return "".join(out)

