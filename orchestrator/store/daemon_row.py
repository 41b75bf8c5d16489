"""The daemon's row (one per state.db): registration, control flags, heartbeat, and the few
reads of live attempts the daemon's loop makes between passes."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.store.db import Store
from orchestrator.store.jobs import add_event


@dataclass(frozen=True)
class DaemonRow:
    pid: int | None
    proc_create_time: float | None
    started_at: float | None = None  # when it registered, after taking the lock


@dataclass(frozen=True)
class DaemonControl:
    draining: bool = False
    stop_requested: bool = False


def read_daemon(store: Store) -> DaemonRow | None:
    """The recorded daemon's process, or None when no daemon ever registered."""
    rows = store.query("SELECT pid, proc_create_time, started_at FROM daemon WHERE id = 1")
    if not rows:
        return None
    return DaemonRow(rows[0]["pid"], rows[0]["proc_create_time"], rows[0]["started_at"])


def register_daemon(
    store: Store, pid: int, proc_create_time: float, now_s: float,
    refuse: Callable[[int | None, float | None], None], modes: Sequence[str] = (),
) -> None:
    """Record this daemon, unless `refuse(pid, create_time)` of the daemon recorded now raises
    (another live daemon): the check and the write are one transaction. `modes`: the opt-in ways
    it runs (`overlap`, `mps`), which the status commands show."""
    with store.write():
        recorded = read_daemon(store)
        if recorded is not None:
            refuse(recorded.pid, recorded.proc_create_time)
        store.execute(
            "INSERT INTO daemon (id, pid, proc_create_time, started_at, heartbeat_at, draining, stop_requested) "
            "VALUES (1, ?, ?, ?, ?, 0, 0) ON CONFLICT(id) DO UPDATE SET pid = excluded.pid, "
            "proc_create_time = excluded.proc_create_time, started_at = excluded.started_at, "
            "heartbeat_at = excluded.heartbeat_at, draining = 0, stop_requested = 0",
            [pid, proc_create_time, now_s, now_s],
        )
        store.execute("UPDATE daemon SET modes_json = ? WHERE id = 1", [json.dumps(list(modes))])


def drop_daemon_mode(store: Store, mode: str) -> None:
    """A mode the running daemon no longer runs in (MPS off on every card): the status commands
    stop showing it. Inside the caller's write."""
    rows = store.query("SELECT modes_json FROM daemon WHERE id = 1")
    if not rows:
        return
    try:
        modes = json.loads(rows[0]["modes_json"] or "[]")
    except ValueError:
        modes = []
    kept = [m for m in modes if m != mode] if isinstance(modes, list) else []
    store.execute("UPDATE daemon SET modes_json = ? WHERE id = 1", [json.dumps(kept)])


def unregister_daemon(store: Store, now_s: float, message: str) -> None:
    with store.write():
        store.execute(
            "UPDATE daemon SET pid = NULL, heartbeat_at = ?, stop_requested = 0, draining = 0 WHERE id = 1",
            [now_s],
        )
        add_event(store, "daemon", message)


def daemon_control(store: Store) -> DaemonControl:
    rows = store.query("SELECT draining, stop_requested FROM daemon WHERE id = 1")
    if not rows:
        return DaemonControl()
    return DaemonControl(bool(rows[0]["draining"]), bool(rows[0]["stop_requested"]))


def write_heartbeat(store: Store, now_s: float, gpus: list[dict[str, Any]], disk: dict[str, Any] | None) -> None:
    with store.write():
        store.execute("UPDATE daemon SET heartbeat_at = ?, gpus_json = ? WHERE id = 1", [now_s, json.dumps(gpus)])
        store.execute("UPDATE daemon SET disk_json = ? WHERE id = 1", [json.dumps(disk) if disk is not None else None])


def data_version(store: Store) -> int:
    """Changes only when another connection commits; this connection's own writes do not count."""
    return int(store.query("PRAGMA data_version")[0]["data_version"])


def any_live_attempt(store: Store) -> bool:
    return bool(store.query("SELECT 1 FROM attempts WHERE outcome IS NULL LIMIT 1"))


def live_run_dirs(store: Store) -> list[str]:
    return [r["run_dir"] for r in store.query("SELECT run_dir FROM attempts WHERE outcome IS NULL")]


def live_host_held_mib(store: Store) -> int:
    """Host RAM the live attempts' process trees hold now, together."""
    return sum(
        int(r["host_held_mib"] or 0)
        for r in store.query("SELECT host_held_mib FROM attempts WHERE outcome IS NULL")
    )


def daemon_row_fields(store: Store) -> dict[str, Any] | None:
    """Every column of the daemon's row (what `orch daemon status` shows), `modes_json` read as
    `modes` (a list of names), or None."""
    rows = store.query("SELECT * FROM daemon WHERE id = 1")
    if not rows:
        return None
    row = dict(rows[0])
    try:
        modes = json.loads(row.pop("modes_json", None) or "[]")
    except ValueError:
        modes = []
    row["modes"] = [str(mode) for mode in modes] if isinstance(modes, list) else []
    return row
