"""Queries for host RAM and CPU learning (per shape) and the last host reading."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.store.db import Store


def read_host_shapes(store: Store) -> dict[str, int]:
    """shape key -> the largest host RAM (MiB) one finished attempt of it took."""
    return {
        r["shape_key"]: int(r["host_peak_mib"])
        for r in store.query("SELECT shape_key, host_peak_mib FROM host_shapes")
    }


def learn_host_shape(store: Store, shape_key: str, host_peak_mib: int, cpu_peak_cores: float | None) -> None:
    """Keep the largest host RAM and CPU use seen for the shape (a finished attempt's peaks)."""
    with store.write():
        store._db.execute(
            "INSERT INTO host_shapes (shape_key, host_peak_mib, cpu_peak_cores, samples, updated_at) "
            "VALUES (?, ?, ?, 1, ?) ON CONFLICT(shape_key) DO UPDATE SET "
            "host_peak_mib = max(host_peak_mib, excluded.host_peak_mib), "
            "cpu_peak_cores = max(coalesce(cpu_peak_cores, 0), coalesce(excluded.cpu_peak_cores, 0)), "
            "samples = samples + 1, updated_at = excluded.updated_at",
            [shape_key, host_peak_mib, cpu_peak_cores, store.now_s()],
        )


def live_ports(store: Store) -> set[int]:
    return {int(r["port"]) for r in store.query("SELECT port FROM attempts WHERE outcome IS NULL AND port IS NOT NULL")}


def write_host_reading(store: Store, reading: dict[str, Any]) -> None:
    with store.write():
        store._db.execute("UPDATE daemon SET host_json = ? WHERE id = 1", [json.dumps(reading)])


def read_host_reading(store: Store) -> dict[str, Any] | None:
    rows = store.query("SELECT host_json FROM daemon WHERE id = 1")
    if not rows or not rows[0]["host_json"]:
        return None
    try:
        loaded = json.loads(rows[0]["host_json"])
    except ValueError:
        return None
    return loaded if isinstance(loaded, dict) else None
