"""The migrations are numbered in the order they apply, and docs/schema.sql is the schema they build."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from orchestrator.store.migrations import MIGRATIONS, migration_modules
from orchestrator.store.migrations.dump import schema_sql

ROOT = Path(__file__).resolve().parents[1]
# The names recorded before migrations had modules of their own: databases already hold them.
LEGACY_NAMES = 30


def test_migration_numbers_strictly_increase():
    numbers = [number for number, _ in migration_modules()]
    assert numbers[0] == 1 and all(a < b for a, b in itertools.pairwise(numbers))


def test_migrations_apply_in_module_order_under_unique_names():
    names = [module.NAME for _, module in migration_modules()]
    assert [m.name for m in MIGRATIONS._migrations] == names
    assert len(set(names)) == len(names)


def test_new_migrations_are_named_for_their_number():
    for number, module in migration_modules()[LEGACY_NAMES:]:
        stem = module.__name__.rsplit(".", 1)[1]
        assert f"m{number:03d}_" + stem.split("_", 1)[1] == module.NAME, stem
        assert re.fullmatch(r"m\d{3}_[a-z0-9_]+", module.NAME)


def test_docs_schema_sql_is_what_the_migrations_build():
    written = (ROOT / "docs" / "schema.sql").read_text()
    assert written == schema_sql(), (
        "docs/schema.sql is stale: python -m orchestrator.store.migrations > docs/schema.sql"
    )
