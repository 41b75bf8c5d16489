"""Queries behind notifications: job events since a cursor, a suite's counts, its URLs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.lifecycle import TERMINAL_VALUES
from orchestrator.store.db import Store


def last_event_id(store: Store) -> int:
    rows = store.query("SELECT MAX(id) AS id FROM events")
    return int(rows[0]["id"] or 0) if rows else 0


@dataclass(frozen=True)
class TerminalEvent:
    """A job that reached succeeded, failed or cancelled, with what its notification names."""

    event_id: int
    to_state: str
    job_id: int
    suite: str
    config_name: str
    seed: int
    data: str
    reason: str | None


def terminal_events_since(store: Store, event_id: int) -> list[TerminalEvent]:
    """Jobs that reached succeeded, failed or cancelled after `event_id`, with the job's fields."""
    marks = ",".join("?" * len(TERMINAL_VALUES))
    rows = store.query(
        "SELECT e.id AS event_id, e.to_state, j.id, j.suite, j.config_name, j.seed, j.data, j.reason "
        f"FROM events e JOIN jobs j ON j.id = e.job_id WHERE e.id > ? AND e.to_state IN ({marks}) ORDER BY e.id",
        [event_id, *TERMINAL_VALUES],
    )
    return [
        TerminalEvent(int(r["event_id"]), r["to_state"], int(r["id"]), r["suite"], r["config_name"], int(r["seed"]),
                      r["data"], r["reason"])
        for r in rows
    ]


def suite_counts(store: Store, suite: str) -> dict[str, int]:
    rows = store.query("SELECT state, COUNT(*) AS n FROM jobs WHERE suite = ? GROUP BY state", [suite])
    return {r["state"]: int(r["n"]) for r in rows}


def suite_notify_urls(store: Store, suite: str) -> list[str]:
    rows = store.query("SELECT urls_json FROM suite_notify WHERE suite = ?", [suite])
    if not rows:
        return []
    urls = json.loads(rows[0]["urls_json"])
    return [u for u in urls if isinstance(u, str)] if isinstance(urls, list) else []


def set_suite_notify_urls(store: Store, suite: str, urls: Sequence[str]) -> None:
    """The suite file's `notify:` as of its latest submit (none: the row goes)."""
    with store.write():
        if urls:
            store._db.execute(
                "INSERT INTO suite_notify (suite, urls_json, updated_at) VALUES (?, ?, ?) ON CONFLICT(suite) "
                "DO UPDATE SET urls_json = excluded.urls_json, updated_at = excluded.updated_at",
                [suite, json.dumps(list(urls)), store.now_s()],
            )
        else:
            store._db.execute("DELETE FROM suite_notify WHERE suite = ?", [suite])
