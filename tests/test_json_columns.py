"""A JSON column reads as a value of its type, or the default: never raises on what a worker wrote."""

from __future__ import annotations

from orchestrator.store.json_columns import json_column


def test_a_column_reads_as_its_defaults_type_or_the_default() -> None:
    assert json_column('{"a": 1}', {}) == {"a": 1}
    assert json_column("[1, 2]", []) == [1, 2]
    assert json_column("[1, 2]", {}) == {}  # of another type
    assert json_column("{}", []) == []
    assert json_column("not json", {}) == {}
    assert json_column(None, []) == []
    assert json_column("", {}) == {}


def test_a_kind_reads_a_value_of_that_type_or_none() -> None:
    assert json_column('{"level": "ok"}', None, dict) == {"level": "ok"}
    assert json_column("{}", None, dict) == {}
    assert json_column("[1]", None, dict) is None
    assert json_column("3", None, dict) is None
    assert json_column(None, None, dict) is None


def test_each_empty_text_is_a_fresh_value() -> None:
    first = json_column("{}", {})
    first["x"] = 1
    assert json_column("{}", {}) == {}
