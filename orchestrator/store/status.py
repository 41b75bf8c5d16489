"""Read-only queries behind the live views (`orch status`, the web page's overview): the
daemon's last reading, the live attempts, the head of the queue, the latest events and ladder
retries, the paused suites and configs, the waiting jobs grouped by reason. Each returns typed
rows; each is bounded or indexed, so a queue of 100,000 jobs answers quickly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.lifecycle import JobState
from orchestrator.plans import DEFAULT_SLOTS
from orchestrator.store.db import Store
from orchestrator.store.jobs import get_gpu_plan
from orchestrator.store.json_columns import json_column
from orchestrator.store.rows import Attempt
from orchestrator.store.sharing import slots_taken


@dataclass(frozen=True)
class DaemonReading:
    """What the daemon last wrote of the machine: GPUs (as its probe read them), its
    heartbeat, the runs dir's free space."""

    gpus: list[dict[str, Any]]
    heartbeat_at: float | None
    disk: dict[str, Any] | None


def daemon_reading(store: Store) -> DaemonReading | None:
    """None before any daemon has written its row."""
    rows = store.query("SELECT gpus_json, heartbeat_at, disk_json FROM daemon WHERE id = 1")
    if not rows:
        return None
    return DaemonReading(json_column(rows[0]["gpus_json"], []), rows[0]["heartbeat_at"],
                         json_column(rows[0]["disk_json"], None, dict))


@dataclass(frozen=True)
class LiveAttempt:
    """A running attempt with the job fields the views show beside it."""

    attempt: Attempt
    suite: str
    config_name: str
    seed: int
    data: str
    overrides: dict[str, Any] = field(default_factory=dict)  # the job's `--set` and `--grid` values


def live_attempts(store: Store) -> list[LiveAttempt]:
    """Every attempt still running, by GPU then start."""
    rows = store.query(
        "SELECT a.*, j.suite AS job_suite, j.config_name AS job_config_name, j.seed AS job_seed, "
        "j.data AS job_data, j.overrides_json AS job_overrides_json "
        "FROM attempts a JOIN jobs j ON j.id = a.job_id "
        "WHERE a.outcome IS NULL ORDER BY a.gpu_index, a.id"
    )
    return [LiveAttempt(Attempt.from_row(r), r["job_suite"], r["job_config_name"], int(r["job_seed"]),
                        r["job_data"], json_column(r["job_overrides_json"], {}, dict))
            for r in rows]


@dataclass(frozen=True)
class GpuNow:
    """One card as the views show it (`orch status`, `orch gpus`, the web page): the daemon's
    last reading, what orch's attempts hold on it and how many run there. A multi-GPU attempt
    counts on every card it has."""

    index: int
    uuid: str
    name: str
    total_mib: int
    used_mib: int
    orch_mib: int  # held by orch's attempts, at most what the card reads as used
    free_mib: int
    running: int  # attempts with a rank on this card
    slots: int
    utilization_pct: float | None = None
    slots_taken: int = 0  # of `slots`: a fused process's members take one between them

    @property
    def foreign_mib(self) -> int:
        return max(0, self.used_mib - self.orch_mib)


def held_on(attempt: Attempt, uuid: str) -> int:
    """What the attempt's tree holds on one card: a gang's reading per card, else its own."""
    held = attempt.held_by_gpu.get(uuid)
    return held if isinstance(held, int) else attempt.held_mib


def cards_now(store: Store, reading: DaemonReading | None, live: list[LiveAttempt]) -> list[GpuNow]:
    """Every card of the daemon's last reading, with orch's attempts on it (every rank)."""
    plan = get_gpu_plan(store)
    cards = []
    for g in reading.gpus if reading else []:
        on_card = [la.attempt for la in live if g["uuid"] in la.attempt.cards]
        orch_mib = min(sum(held_on(a, g["uuid"]) for a in on_card), int(g["used_mib"]))
        utilization = g.get("utilization_pct")
        cards.append(GpuNow(
            int(g["index"]), str(g["uuid"]), str(g["name"]), int(g["total_mib"]), int(g["used_mib"]), orch_mib,
            int(g["free_mib"]), len(on_card), plan.slots_for(int(g["index"]), DEFAULT_SLOTS),
            utilization if isinstance(utilization, (int, float)) and not isinstance(utilization, bool) else None,
            slots_taken(on_card),
        ))
    return cards


@dataclass(frozen=True)
class WaitingJob:
    job_id: int
    suite: str
    config: str
    seed: int
    data: str
    reason: str | None  # why it waits, as the daemon last wrote it
    overrides: dict[str, Any] = field(default_factory=dict)  # its `--set` and `--grid` values


def first_waiting(store: Store, limit: int) -> list[WaitingJob]:
    """The head of the queue, in the order the daemon considers it."""
    rows = store.query(
        "SELECT id, suite, config_name, seed, data, wait_reason, overrides_json FROM jobs "
        "WHERE state = ? "
        "ORDER BY priority DESC, id LIMIT ?", [JobState.QUEUED.value, limit],
    )
    return [WaitingJob(r["id"], r["suite"], r["config_name"], r["seed"], r["data"],
                       r["wait_reason"], json_column(r["overrides_json"], {}, dict)) for r in rows]


@dataclass(frozen=True)
class Event:
    id: int
    ts: float
    job_id: int | None
    attempt_id: int | None
    kind: str
    from_state: str | None
    to_state: str | None
    message: str
    data: dict[str, Any] | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Event:
        return cls(row["id"], row["ts"], row.get("job_id"), row.get("attempt_id"), row["kind"], row.get("from_state"),
                   row.get("to_state"), row["message"], json_column(row.get("data_json"), None, dict))

    @property
    def retry(self) -> dict[str, Any]:
        """A ladder retry's move (from_level, to_level, why[, host_step]); empty for other events."""
        move = (self.data or {}).get("retry")
        return move if isinstance(move, dict) else {}


def recent_events(store: Store, limit: int) -> list[Event]:
    """The latest `limit` events, oldest first."""
    rows = store.query("SELECT * FROM events ORDER BY id DESC LIMIT ?", [limit])
    return [Event.from_row(r) for r in reversed(rows)]


def events_after(store: Store, event_id: int, limit: int = 500) -> list[Event]:
    """The events written after `event_id`, oldest first (at most `limit`): a log that follows
    the sweep line by line."""
    return [Event.from_row(r) for r in store.query("SELECT * FROM events WHERE id > ? ORDER BY id LIMIT ?",
                                                   [event_id, limit])]


def job_events(store: Store, job_id: int, limit: int = 200) -> list[Event]:
    """A job's first `limit` events, oldest first."""
    return [Event.from_row(r) for r in store.query("SELECT * FROM events WHERE job_id = ? ORDER BY id LIMIT ?",
                                                   [job_id, limit])]


def recent_retries(store: Store, limit: int) -> list[Event]:
    """The latest `limit` moves down the ladder, newest first (a partial index holds exactly these)."""
    rows = store.query("SELECT * FROM events WHERE retry = 1 ORDER BY id DESC LIMIT ?", [limit])
    return [Event.from_row(r) for r in rows]


@dataclass(frozen=True)
class PausedSuite:
    """A suite held back (`orch pause`, or the crash-loop guard): its queued jobs wait for it."""

    suite: str
    reason: str
    paused_at: float
    queued: int | None  # its queued jobs, which wait for it (None: not counted)


@dataclass(frozen=True)
class PausedConfig:
    """One config of a suite held back by the crash-loop guard: its queued jobs wait for it, the
    suite's other configs run on."""

    suite: str
    config: str
    reason: str
    paused_at: float
    queued: int | None  # its queued jobs (None: not counted)


def paused_configs(store: Store, *, count_queued: bool = True) -> list[PausedConfig]:
    """Every paused config, by suite and name (the daemon's pass asks without `count_queued`)."""
    if not count_queued:
        rows = store.query(
            "SELECT suite, config_name, reason, paused_at FROM paused_configs ORDER BY suite, config_name"
        )
        return [PausedConfig(r["suite"], r["config_name"], r["reason"], r["paused_at"], None) for r in rows]
    rows = store.query(
        "SELECT p.suite, p.config_name, p.reason, p.paused_at, (SELECT COUNT(*) FROM jobs j WHERE j.suite = p.suite "
        "AND j.config_name = p.config_name AND j.state = ?) AS queued FROM paused_configs p "
        "ORDER BY p.suite, p.config_name",
        [JobState.QUEUED.value],
    )
    return [PausedConfig(r["suite"], r["config_name"], r["reason"], r["paused_at"], int(r["queued"])) for r in rows]


@dataclass(frozen=True)
class WaitingGroup:
    """Queued jobs that wait for one reason (as the daemon last wrote it; None: not yet
    considered), outside paused suites and configs."""

    reason: str | None
    jobs: int
    first_id: int
    last_id: int


WAITING_HEAD = 200  # the head of the queue the views group: the daemon explains only its first jobs


def waiting_groups(store: Store, limit: int, head: int = WAITING_HEAD) -> list[WaitingGroup]:
    """The first `head` queued jobs (in the daemon's order, outside paused suites and configs)
    grouped by their waiting reason, the largest groups first. Bounded by `head`, not by the
    queue: 50,000 queued jobs cost what 200 do."""
    rows = store.query(
        "SELECT wait_reason, COUNT(*) AS n, MIN(id) AS first_id, MAX(id) AS last_id FROM ("
        "SELECT id, wait_reason FROM jobs j WHERE state = ? "
        "AND NOT EXISTS (SELECT 1 FROM paused_suites p WHERE p.suite = j.suite) "
        "AND NOT EXISTS (SELECT 1 FROM paused_configs c WHERE c.suite = j.suite AND c.config_name = j.config_name) "
        "ORDER BY priority DESC, id LIMIT ?) GROUP BY wait_reason ORDER BY n DESC, first_id LIMIT ?",
        [JobState.QUEUED.value, head, limit],
    )
    return [WaitingGroup(r["wait_reason"], int(r["n"]), int(r["first_id"]), int(r["last_id"])) for r in rows]


def paused_suites(store: Store, *, count_queued: bool = True) -> list[PausedSuite]:
    """Every paused suite, by name: the one reader of the table, for the views and the daemon.
    The daemon's pass asks without `count_queued`: counting a paused suite of 50,000 queued jobs
    takes about 10 ms, and the pass needs only the names and reasons."""
    if not count_queued:
        rows = store.query("SELECT suite, reason, paused_at FROM paused_suites ORDER BY suite")
        return [PausedSuite(r["suite"], r["reason"], r["paused_at"], None) for r in rows]
    rows = store.query(
        "SELECT p.suite, p.reason, p.paused_at, (SELECT COUNT(*) FROM jobs j WHERE j.suite = p.suite "
        "AND j.state = ?) AS queued FROM paused_suites p ORDER BY p.suite", [JobState.QUEUED.value],
    )
    return [PausedSuite(r["suite"], r["reason"], r["paused_at"], int(r["queued"])) for r in rows]
