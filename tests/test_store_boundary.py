"""SQL lives only under orchestrator/store/: no other module holds a statement or reaches the
store's connection, so a schema change is made, and checked, in one place."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"
# statements as the code writes them: keywords in capitals
STATEMENT = re.compile(
    r"^\s*(SELECT\b.*\bFROM\b|INSERT (OR \w+ )?INTO\b|UPDATE \w+ SET\b|DELETE FROM\b|CREATE (TABLE|INDEX)\b"
    r"|ALTER TABLE\b|PRAGMA )", re.S)


def sql_outside_store() -> list[str]:
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "store":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and STATEMENT.search(node.value):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value.strip()[:60]!r}")
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("_db", "db", "conn")
                and isinstance(node.value, ast.Name)
                and node.value.id == "store"
            ):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: store.{node.attr}")
    return found


def test_the_check_sees_a_statement() -> None:
    assert STATEMENT.search("SELECT id FROM jobs") and STATEMENT.search("  UPDATE jobs SET state = ?")
    assert not STATEMENT.search("select a config from the list") and not STATEMENT.search("select-window")


def test_no_sql_outside_the_store() -> None:
    assert sql_outside_store() == []
