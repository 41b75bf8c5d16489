"""The queue as the daemon keeps it between passes: every queued job's light columns in queue
order, brought up to date from the jobs' change log (m014) instead of read whole each pass.

A pass re-reads only the rows a submit, cancel, priority change, retry or the daemon's own
claims touched since the last; a burst of changes (a large submit) reads the whole queue again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.store.db import Store
from orchestrator.store.queue import (
    forget_queue_changes,
    queue_changes_since,
    queued_entries,
    queued_entries_by_id,
)
from orchestrator.store.rows import QueueEntry

FULL_READ_CHANGES = 2_000  # more changed jobs than this (and than a quarter of the queue): read it all
FORGET_AFTER = 1_000  # log rows read before the daemon deletes them


def _queue_order(entry: QueueEntry) -> tuple[int, int]:
    return (-entry.priority, entry.id)


@dataclass
class QueueRead:
    order: list[QueueEntry]  # every queued job, in queue order
    left: set[int]  # jobs that left the queue since the last read
    whole: bool  # the whole queue was read: anything not in `order` has left it


@dataclass
class QueueCache:
    entries: dict[int, QueueEntry] = field(default_factory=dict)
    order: list[QueueEntry] = field(default_factory=list)
    mark: int | None = None  # the last change applied; None: the queue was never read whole
    forgotten: int = 0  # log rows up to here are deleted

    def read(self, store: Store) -> QueueRead:
        """Every queued job in queue order, with only what changed read from the store."""
        if self.mark is None:
            return self._read_whole(store)
        mark, changed = queue_changes_since(store, self.mark)
        if not changed:
            return QueueRead(self.order, set(), False)
        if len(changed) > max(FULL_READ_CHANGES, len(self.entries) // 4):
            return self._read_whole(store)
        fresh = queued_entries_by_id(store, changed)
        left: set[int] = set()
        reorder = False
        for job_id in changed:
            new, old = fresh.get(job_id), self.entries.get(job_id)
            if new is None:
                if old is not None:
                    del self.entries[job_id]
                    left.add(job_id)
                continue
            reorder = reorder or old is None or old.priority != new.priority
            self.entries[job_id] = new
        if reorder:
            self.order = sorted(self.entries.values(), key=_queue_order)
        else:  # removals and updates in place keep the order
            self.order = [self.entries[e.id] for e in self.order if e.id in self.entries]
        self.mark = mark
        self._forget(store)
        return QueueRead(self.order, left, False)

    def head(self, store: Store, limit: int) -> list[QueueEntry] | None:
        """The first `limit` queued jobs, from what is kept (None: nothing kept yet)."""
        if self.mark is None:
            return None
        return self.read(store).order[:limit]

    def _read_whole(self, store: Store) -> QueueRead:
        before = set(self.entries)
        self.mark, self.order = queued_entries(store)
        self.entries = {e.id: e for e in self.order}
        self._forget(store)
        return QueueRead(self.order, before - set(self.entries), True)

    def _forget(self, store: Store) -> None:
        assert self.mark is not None
        if self.mark - self.forgotten >= FORGET_AFTER:
            forget_queue_changes(store, self.mark)
            self.forgotten = self.mark
