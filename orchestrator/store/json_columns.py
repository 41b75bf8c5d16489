"""A JSON column's value as the code above the store sees it: parsed once, of the expected
type, and never raising. The columns hold text that workers' files and older versions wrote."""

from __future__ import annotations

import json
from typing import Any

_EMPTY_JSON: dict[Any, type] = {"{}": dict, "[]": list}  # most JSON columns of most rows


def json_column(text: Any, default: Any, kind: type | None = None) -> Any:
    """A JSON column's value, or `default` when it is empty, not JSON, or not of `kind`
    (the default's own type unless given: `json_column(text, None, dict)` reads a dict or None)."""
    if not text:
        return default
    expected = type(default) if kind is None else kind
    if isinstance(text, str) and (empty := _EMPTY_JSON.get(text)) is not None:
        return empty() if issubclass(expected, empty) else default
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return default
    return value if isinstance(value, expected) else default
