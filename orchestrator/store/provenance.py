"""Reads of the provenance digests stored with attempts at their end (m025): for the report's
summary of what a sweep's runs ran with."""

from __future__ import annotations

from collections import Counter

from orchestrator.lifecycle import AttemptOutcome
from orchestrator.store.db import Store
from orchestrator.store.json_columns import json_column


def provenance_counts(store: Store, fields: tuple[str, ...]) -> dict[str, list[tuple[str, int]]]:
    """Per field, each value the succeeded attempts recorded and how many did, most common
    first; a field no attempt recorded is left out."""
    counts: dict[str, Counter[str]] = {name: Counter() for name in fields}
    rows = store.query("SELECT provenance_json FROM attempts WHERE outcome = ? AND provenance_json IS NOT NULL",
                       [AttemptOutcome.SUCCEEDED.value])
    for row in rows:
        digest = json_column(row["provenance_json"], {})
        for name in fields:
            value = digest.get(name)
            if isinstance(value, str):
                counts[name][value] += 1
    return {name: counter.most_common() for name, counter in counts.items() if counter}
