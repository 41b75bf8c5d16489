"""state.db's schema as versioned migrations, one module each, applied in their sequence order.

Each module is `seqNNN_<what>.py` with `NAME` (the name recorded in `_sqlite_migrations`) and
`migrate(db)`. Never edit an applied migration: add a module with the next sequence number, and
for a new one let `NAME` be `mNNN_<what>` with the same number (numbers may skip, never repeat).
The first 30 keep the names they were recorded under (some out of order, `m022` twice), which
existing databases already hold. `docs/schema.sql` is the schema they build (`python -m
orchestrator.store.migrations`).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType

from sqlite_utils.migrations import Migrations

MODULE_NAME = re.compile(r"seq(\d{3})_[a-z0-9_]+")


def migration_modules() -> list[tuple[int, ModuleType]]:
    """(sequence number, module) of every migration, in sequence order."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if (match := MODULE_NAME.fullmatch(info.name)) is None:
            continue
        found.append((int(match.group(1)), importlib.import_module(f"{__name__}.{info.name}")))
    return sorted(found, key=lambda pair: pair[0])


def _registered() -> Migrations:
    migrations = Migrations("orch")
    for _, module in migration_modules():
        migrations(name=module.NAME)(module.migrate)
    return migrations


MIGRATIONS = _registered()
