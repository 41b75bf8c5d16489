"""Typed rows kept between reads of the same rows: a row read again with every column unchanged
gives back the object built from it before (rows are frozen), so its JSON columns are not
parsed again. The daemon reads its live attempts and their jobs twice in every pass; most of
them have not changed since the last pass."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RowMemo(Generic[T]):
    def __init__(self, build: Callable[[Mapping[str, Any]], T]) -> None:
        self._build = build
        self._rows: dict[int, tuple[tuple[tuple[str, Any], ...], T]] = {}  # id -> (columns, row)

    def get(self, row: Mapping[str, Any]) -> T:
        """The typed row: the one kept when every column is as it was, else built now."""
        columns = tuple(row.items())
        row_id = int(row["id"])
        kept = self._rows.get(row_id)
        if kept is not None and kept[0] == columns:
            return kept[1]
        built = self._build(row)
        self._rows[row_id] = (columns, built)
        return built

    def keep_only(self, ids: Iterable[int]) -> None:
        """Forget rows not among `ids` (those no longer read)."""
        keep = set(ids)
        self._rows = {k: v for k, v in self._rows.items() if k in keep}
