"""Typed rows kept between reads of the same rows: a row read again with every column unchanged
gives back the object built from it before (rows are frozen), so its JSON columns are not
parsed again, and no dict is made of it. The daemon reads its live attempts and their jobs
twice in every pass; most of them have not changed since the last pass."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RowMemo(Generic[T]):
    def __init__(self, build: Callable[[Mapping[str, Any]], T]) -> None:
        self._build = build
        self._rows: dict[int, tuple[tuple[str, ...], tuple[Any, ...], T]] = {}  # id -> (names, values, row)

    def _get(self, names: tuple[str, ...], values: tuple[Any, ...], row_id: int) -> T:
        kept = self._rows.get(row_id)
        if kept is not None and kept[1] == values and kept[0] == names:
            return kept[2]
        built = self._build(dict(zip(names, values, strict=True)))
        self._rows[row_id] = (names, values, built)
        return built

    def rows(self, cursor: sqlite3.Cursor) -> list[T]:
        """The typed rows of a query with an `id` column: each the one kept when every column is
        as it was, else built now."""
        names = tuple(column[0] for column in cursor.description or ())
        at = names.index("id")
        return [self._get(names, values, int(values[at])) for values in map(tuple, cursor)]

    def get(self, row: Mapping[str, Any]) -> T:
        """One row given as a mapping of its columns."""
        return self._get(tuple(row), tuple(row.values()), int(row["id"]))

    def keep_only(self, ids: Iterable[int]) -> None:
        """Forget rows not among `ids` (those no longer read)."""
        keep = set(ids)
        self._rows = {k: v for k, v in self._rows.items() if k in keep}
