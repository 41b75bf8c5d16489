"""Which job states are terminal is said once, in orchestrator/lifecycle.py: no other module
spells the set again (as a tuple or set of the names, or as an SQL list)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from orchestrator.lifecycle import TERMINAL_STATES, TERMINAL_VALUES, JobState
from orchestrator.store.queries import TERMINAL_SQL

PACKAGE = Path(__file__).resolve().parent.parent / "orchestrator"
NAMES = {state.value for state in TERMINAL_STATES}
SQL_LIST = re.compile(r"\(\s*'\w+'(?:\s*,\s*'\w+'){2,}\s*\)")


def test_the_values_follow_the_enum() -> None:
    assert TERMINAL_VALUES == ("succeeded", "failed", "cancelled", "pruned")
    assert {JobState(v) for v in TERMINAL_VALUES} == TERMINAL_STATES
    assert TERMINAL_SQL == "('succeeded', 'failed', 'cancelled', 'pruned')"


def test_no_module_but_lifecycle_spells_the_terminal_states() -> None:
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "lifecycle.py":
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.Tuple, ast.Set, ast.List)):
                values = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                members = {getattr(e, "attr", None) for e in node.elts if isinstance(e, ast.Attribute)}
                if values == NAMES or {m.lower() for m in members if m} == NAMES:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for match in SQL_LIST.finditer(node.value):
                    if set(re.findall(r"'(\w+)'", match.group(0))) == NAMES:
                        found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} (SQL)")
    assert not found, found
