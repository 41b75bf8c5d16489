"""Benchmarks measure orch through its public API: no SQL of their own (the store's functions
own the schema), no sqlite3, no private name of orchestrator. Read from the source, not run."""

from __future__ import annotations

import ast
import re
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SQL = re.compile(r"^\s*(SELECT\b.*\bFROM\b|INSERT\s+INTO\b|UPDATE\s+\w+\s+SET\b|DELETE\s+FROM\b|"
                 r"(CREATE|DROP|ALTER)\s+(TABLE|INDEX)\b|PRAGMA\s+\w+)", re.IGNORECASE | re.DOTALL)
DATABASE_CALLS = {"execute", "executemany", "executescript", "query", "iter_rows"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def violations(source: str) -> list[str]:
    """What in one file reaches past orch's public API, one line each."""
    found: list[str] = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sqlite3":
                    found.append(f"{line}: imports sqlite3")
                if alias.name.split(".")[0] == "orchestrator" and any(_private(p) for p in alias.name.split(".")):
                    found.append(f"{line}: imports the private {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[0] == "sqlite3":
                found.append(f"{line}: imports sqlite3")
            if module.split(".")[0] == "orchestrator":
                for name in [*module.split("."), *(alias.name for alias in node.names)]:
                    if _private(name):
                        found.append(f"{line}: imports the private {name} from {module}")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append(f"{line}: uses the private attribute {node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in DATABASE_CALLS:
            found.append(f"{line}: runs SQL through .{node.func.attr}()")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.match(node.value):
            found.append(f"{line}: holds SQL: {node.value[:40]!r}")
    return found


def test_benchmarks_use_only_the_public_api() -> None:
    files = sorted(BENCHMARKS.rglob("*.py"))
    assert len(files) > 10
    found = [f"{path.relative_to(BENCHMARKS.parent)}:{v}" for path in files for v in violations(path.read_text())]
    assert not found, "\n".join(found)


def test_the_check_sees_each_way_past_the_api() -> None:
    source = '''
import sqlite3
from orchestrator.cli.daemon_cmd import _make_executor
from orchestrator._internal import thing
import orchestrator.store._private
store.query("SELECT count(*) AS n FROM attempts")
store.executemany(sql, rows)
daemon._idle_until = None
TEXT = "insert into jobs (id) values (1)"
self._own = 1
print("select a GPU first")
'''
    found = violations(source)
    assert [v.split(":")[0] for v in found].count("2") == 1
    for line in (3, 4, 5, 6, 7, 8, 9):
        assert any(v.startswith(f"{line}:") for v in found), (line, found)
    assert not any(v.startswith(("10:", "11:")) for v in found), found
