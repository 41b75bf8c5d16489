"""Which queued jobs one scheduling pass hands to `pack`.

Jobs of one kind (the same shape, level, card and host needs, priority, suite, config and task)
differ for packing only by their place in the queue, and `pack` takes them in that order. No
pass places more jobs than there are free slots, so `pack` needs only that many of each kind,
and the head of the queue, whose waiting reasons it gives. The kinds are kept between passes,
each a list in queue order, updated from the jobs the queue's change log names.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.scheduling.queue_index import queue_order
from orchestrator.store.rows import QueueEntry

if TYPE_CHECKING:
    from orchestrator.prediction.job_facts import JobFacts

Kind = tuple[Any, ...]


def kind_of(facts: JobFacts, entry: QueueEntry) -> Kind:
    return (facts.kind, entry.priority, entry.suite, entry.config_name, entry.data)


@dataclass
class KindIndex:
    """Each kind's queued jobs in queue order. An entry stays in its list after its job left
    the queue or was read again; such stale entries are skipped and dropped when met."""

    lists: dict[Kind, list[QueueEntry]] = field(default_factory=dict)

    def rebuild(self, order: Iterable[QueueEntry], facts: Mapping[int, JobFacts]) -> None:
        self.lists = {}
        for entry in order:
            job_facts = facts.get(entry.id)
            if job_facts is not None:
                self.lists.setdefault(kind_of(job_facts, entry), []).append(entry)

    def add(self, changed: Collection[int], entries: Mapping[int, QueueEntry], facts: Mapping[int, JobFacts]) -> None:
        """Jobs read again: each goes into its kind's list at its place in the queue."""
        for job_id in changed:
            entry, job_facts = entries.get(job_id), facts.get(job_id)
            if entry is not None and job_facts is not None:
                bisect.insort(self.lists.setdefault(kind_of(job_facts, entry), []), entry, key=queue_order)

    def heads(self, per_kind: int, entries: Mapping[int, QueueEntry]) -> list[QueueEntry]:
        """The first `per_kind` queued jobs of every kind."""
        taken: list[QueueEntry] = []
        for kind in list(self.lists):
            jobs = self.lists[kind]
            kept = 0
            position = 0
            while position < len(jobs) and kept < per_kind:
                entry = jobs[position]
                if entries.get(entry.id) is entry:
                    taken.append(entry)
                    kept += 1
                    position += 1
                else:
                    del jobs[position]  # left the queue, or read again (its fresh entry is elsewhere)
            if not jobs:
                del self.lists[kind]
        return taken


def handed_to_pack(head: list[QueueEntry], heads: list[QueueEntry]) -> list[QueueEntry]:
    """The head of the queue and each kind's first jobs, once each, in queue order."""
    chosen = {e.id: e for e in head}
    for entry in heads:
        chosen.setdefault(entry.id, entry)
    return sorted(chosen.values(), key=queue_order)
