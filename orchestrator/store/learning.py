"""What orch has learned per job shape: memory rows (listing, forgetting, who taught them) and
throughput per GPU, shape and number of jobs on the card."""

from __future__ import annotations

import json
from dataclasses import dataclass

from orchestrator.store.db import Store
from orchestrator.store.queue import live_attempts_with_jobs
from orchestrator.store.rows import Attempt, FamilyTag, Job


@dataclass(frozen=True)
class ThroughputRow:
    gpu_uuid: str
    shape_key: str
    tenants: int  # attempts on the card, this one included
    samples_per_s: float
    samples: int
    steps: int = 0  # optimizer steps the readings cover
    rate_min: float | None = None
    rate_max: float | None = None


# a shape row's suites_json lists every suite that taught it (label_shape; m015 seeded it from `suite`)
_TAUGHT_BY = "EXISTS (SELECT 1 FROM json_each(memory_shapes.suites_json) WHERE value = ?)"


def label_shape(store: Store, shape_key: str, suite: str, label: str, family: FamilyTag | None = None) -> None:
    """Name the suite and config that last taught a shape (shown by `orch memory`), add the
    suite to those that taught it (`orch memory forget --suite`), and place it in its family."""
    with store.write():
        store._db.execute(
            f"UPDATE memory_shapes SET suite = ?, label = ?, suites_json = CASE WHEN {_TAUGHT_BY} "
            "THEN suites_json ELSE json_insert(suites_json, '$[#]', ?) END WHERE shape_key = ?",
            [suite, label, suite, suite, shape_key],
        )
        if family is not None:
            store._db.execute(
                "UPDATE memory_shapes SET family_key = ?, batch_size = ?, tokens = ? WHERE shape_key = ?",
                [family.family_key, family.batch_size, family.tokens, shape_key],
            )


@dataclass(frozen=True)
class FamilyMember:
    """A learned shape that belongs to a memory family."""

    shape_key: str
    tag: FamilyTag
    peak_mib: int | None
    oom_floor_mib: int | None
    samples: int
    suite: str | None
    label: str | None


def read_family_members(store: Store) -> list[FamilyMember]:
    """Every learned shape placed in a family (the scheduler reads them once per pass)."""
    rows = store.query(
        "SELECT shape_key, family_key, batch_size, tokens, peak_mib, oom_floor_mib, samples, suite, label "
        "FROM memory_shapes WHERE family_key IS NOT NULL AND batch_size > 0 ORDER BY family_key, batch_size"
    )
    return [
        FamilyMember(r["shape_key"], FamilyTag(r["family_key"], int(r["batch_size"]), r["tokens"],
                                               r["shape_key"].rsplit("|", 1)[-1]),
                     r["peak_mib"], r["oom_floor_mib"], int(r["samples"] or 0), r["suite"], r["label"])
        for r in rows
    ]


@dataclass(frozen=True)
class LearnedShape:
    """A shape's learned memory with who taught it (`orch memory`)."""

    shape_key: str
    peak_mib: int | None
    oom_floor_mib: int | None
    samples: int
    suite: str | None  # the suite that taught it last
    label: str | None
    suites: tuple[str, ...] = ()  # every suite that taught it, in the order they did


def list_shapes(store: Store) -> list[LearnedShape]:
    rows = store.query(
        "SELECT shape_key, peak_mib, oom_floor_mib, samples, suite, label, "
        "(SELECT json_group_array(value) FROM json_each(memory_shapes.suites_json) "
        " WHERE json_each.type = 'text') AS suites FROM memory_shapes ORDER BY suite, label, shape_key"
    )
    return [LearnedShape(r["shape_key"], r["peak_mib"], r["oom_floor_mib"], int(r["samples"] or 0), r["suite"],
                         r["label"], tuple(json.loads(r["suites"] or "[]"))) for r in rows]


def forget_shapes(store: Store, shape_key: str | None = None, suite: str | None = None) -> list[str]:
    """Delete learned memory and throughput of one shape, or what a suite taught: every shape
    whose memory it taught (alone or with other suites), with that shape's throughput, and the
    throughput readings it measured last. Returns the keys of the shapes that lost anything."""
    if (shape_key is None) == (suite is None):
        raise ValueError("give exactly one of shape_key and suite")
    forgotten: list[str] = []
    with store.write():
        if shape_key is not None:
            memory_keys = [shape_key]
        else:
            memory_keys = [r["shape_key"] for r in store.query(
                f"SELECT shape_key FROM memory_shapes WHERE {_TAUGHT_BY}", [suite])]  # fmt: skip
        for key in memory_keys:
            memory = store._db.execute("DELETE FROM memory_shapes WHERE shape_key = ?", [key]).rowcount
            rates = store._db.execute("DELETE FROM throughput WHERE shape_key = ?", [key]).rowcount
            if memory or rates:
                forgotten.append(key)
        if suite is not None:
            # a throughput row remembers the suite that measured it last
            measured = [r["shape_key"] for r in store.query(
                "SELECT DISTINCT shape_key FROM throughput WHERE suite = ?", [suite])]  # fmt: skip
            store._db.execute("DELETE FROM throughput WHERE suite = ?", [suite])
            forgotten += [key for key in measured if key not in forgotten]
    return forgotten


def suite_known(store: Store, suite: str) -> bool:
    """Does the database hold a job of this suite, or anything it taught?"""
    return bool(store.query(
        f"SELECT 1 FROM jobs WHERE suite = ? UNION SELECT 1 FROM memory_shapes WHERE {_TAUGHT_BY} "
        "UNION SELECT 1 FROM throughput WHERE suite = ? LIMIT 1", [suite, suite, suite]))  # fmt: skip


def record_throughput(
    store: Store, gpu_uuid: str, shape_key: str, tenants: int, samples_per_s: float, suite: str, steps: int = 1
) -> None:
    """Fold one reading (over `steps` optimizer steps) into the running mean for (GPU, shape, tenants)."""
    with store.write():
        store._db.execute(
            "INSERT INTO throughput (gpu_uuid, shape_key, tenants, samples_per_s, samples, suite, updated_at, "
            "steps, rate_min, rate_max) VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?, ?) "
            "ON CONFLICT(gpu_uuid, shape_key, tenants) DO UPDATE SET "
            "samples_per_s = (samples_per_s * samples + excluded.samples_per_s) / (samples + 1), "
            "samples = samples + 1, suite = excluded.suite, updated_at = excluded.updated_at, "
            "steps = steps + excluded.steps, rate_min = min(coalesce(rate_min, excluded.rate_min), excluded.rate_min), "
            "rate_max = max(coalesce(rate_max, excluded.rate_max), excluded.rate_max)",
            [gpu_uuid, shape_key, tenants, samples_per_s, suite, store.now_s(), steps, samples_per_s, samples_per_s],
        )


def read_throughput(store: Store) -> list[ThroughputRow]:
    rows = store.query(
        "SELECT gpu_uuid, shape_key, tenants, samples_per_s, samples, steps, rate_min, rate_max FROM throughput "
        "ORDER BY shape_key, gpu_uuid, tenants"
    )
    return [
        ThroughputRow(r["gpu_uuid"], r["shape_key"], int(r["tenants"]), float(r["samples_per_s"]), int(r["samples"]),
                      int(r["steps"]), r["rate_min"], r["rate_max"])
        for r in rows
    ]


def live_attempts_and_jobs(store: Store) -> tuple[list[Attempt], dict[int, Job]]:
    """Every live attempt, and the jobs they belong to by id."""
    return live_attempts_with_jobs(store)


def shape_known(store: Store, shape_key: str) -> bool:
    """Has orch learned anything (memory or throughput) of this shape?"""
    return bool(store.query("SELECT 1 FROM memory_shapes WHERE shape_key = ? UNION "
                            "SELECT 1 FROM throughput WHERE shape_key = ?", [shape_key, shape_key]))
