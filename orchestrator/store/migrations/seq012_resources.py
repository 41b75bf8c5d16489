"""Migration m012_resources."""

from __future__ import annotations

import sqlite_utils

NAME = "m012_resources"  # as recorded in _sqlite_migrations: never change it


def migrate(db: sqlite_utils.Database) -> None:
    # Jobs bigger than one GPU and the host's other resources. A job asks for `gpus` cards (a
    # gang) and, when the suite says so, `cpus` cores. An attempt keeps all its cards (the first
    # stays in gpu_index/gpu_uuid), what its tree holds on each now and at its peak (JSON
    # {uuid: MiB}: the per-rank peaks; per process too, for ranks sharing a card), its rendezvous
    # port, and its host RAM (RSS of the process tree) and CPU use, now and at their peak. Host
    # RAM and CPU are learned per shape beside GPU memory. The daemon row keeps its last host
    # reading for `orch status`.
    for statement in (
        "ALTER TABLE jobs ADD COLUMN gpus INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE jobs ADD COLUMN cpus INTEGER",
        "ALTER TABLE attempts ADD COLUMN gpu_uuids_json TEXT",
        "ALTER TABLE attempts ADD COLUMN held_by_gpu_json TEXT",
        "ALTER TABLE attempts ADD COLUMN peak_by_gpu_json TEXT",
        "ALTER TABLE attempts ADD COLUMN peak_by_rank_json TEXT",  # {pid: {gpu: uuid, mib: peak}}
        "ALTER TABLE attempts ADD COLUMN port INTEGER",
        "ALTER TABLE attempts ADD COLUMN predicted_host_mib INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE attempts ADD COLUMN host_held_mib INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE attempts ADD COLUMN host_peak_mib INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE attempts ADD COLUMN cpu_peak_cores REAL",
        "ALTER TABLE daemon ADD COLUMN host_json TEXT",
        """
        CREATE TABLE host_shapes (
            shape_key TEXT PRIMARY KEY,
            host_peak_mib INTEGER NOT NULL,  -- largest RSS of one attempt's process tree
            cpu_peak_cores REAL,             -- largest CPU use of one attempt, in cores
            samples INTEGER NOT NULL,
            updated_at REAL NOT NULL
        )
        """,
    ):
        db.execute(statement)
