"""Print the schema a fresh state.db has after every migration: `docs/schema.sql`."""

from orchestrator.store.migrations.dump import schema_sql

print(schema_sql(), end="")
