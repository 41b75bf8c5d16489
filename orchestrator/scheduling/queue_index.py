"""The queue as the daemon keeps it between passes: every queued job's light columns in queue
order, brought up to date from the jobs' change log (m014) instead of read whole each pass.

A pass re-reads only the rows a submit, cancel, priority change, retry or the daemon's own
claims touched since the last; a burst of changes (a large submit) reads the whole queue again.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from orchestrator.scheduling.queue_waits import QueueWaits
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


def queue_order(entry: QueueEntry) -> tuple[int, int]:
    """Queue order: priority first, then submission (the store's own ORDER BY)."""
    return (-entry.priority, entry.id)


@dataclass
class QueueRead:
    left: set[int]  # jobs that left the queue since the last read
    whole: bool  # the whole queue was read: anything not kept has left it
    changed: set[int] = field(default_factory=set)  # queued jobs read again (not whole)


@dataclass
class QueueCache:
    """`entries` is exact after each read. `order` is kept lazily: a job that left the queue
    or was read again may still sit there, and is dropped or replaced when the head is read."""

    entries: dict[int, QueueEntry] = field(default_factory=dict)
    order: list[QueueEntry] = field(default_factory=list)
    mark: int | None = None  # the last change applied; None: the queue was never read whole
    forgotten: int = 0  # log rows up to here are deleted
    with_reason: set[int] = field(default_factory=set)  # queued jobs that show a waiting reason
    pending: QueueRead = field(default_factory=lambda: QueueRead(set(), False))  # since `take_changes`
    # how long each queued job has waited, on the daemon's monotonic clock from the read that first saw it
    waits: QueueWaits = field(default_factory=QueueWaits)

    def read(self, store: Store) -> QueueRead:
        """Bring the kept queue up to date, reading only what changed."""
        if self.mark is None:
            return self._read_whole(store)
        mark, changed = queue_changes_since(store, self.mark)
        if not changed:
            return QueueRead(set(), False)
        if len(changed) > max(FULL_READ_CHANGES, len(self.entries) // 4):
            return self._read_whole(store)
        fresh = queued_entries_by_id(store, changed)
        now_s, monotonic_s = store.now_s(), store.clock.monotonic_s()
        left: set[int] = set()
        reorder = False
        for job_id in changed:
            new, old = fresh.get(job_id), self.entries.get(job_id)
            if new is None or new.wait_reason is None:
                self.with_reason.discard(job_id)
            else:
                self.with_reason.add(job_id)
            if new is None:
                self.waits.forget([job_id])
                if old is not None:
                    del self.entries[job_id]
                    left.add(job_id)
                continue
            self.entries[job_id] = new
            self.waits.saw(new, now_s, monotonic_s)
            if old is None:
                bisect.insort(self.order, new, key=queue_order)
            elif old.priority != new.priority:
                reorder = True
        if reorder:
            self.order = sorted(self.entries.values(), key=queue_order)
        self.mark = mark
        self._forget(store)
        return self._note(QueueRead(left, False, set(fresh)))

    def take_changes(self) -> QueueRead:
        """What changed over every read since the last call (a pass that looked only at the
        head of the queue leaves its changes to the next pass that packs)."""
        taken, self.pending = self.pending, QueueRead(set(), False)
        return taken

    def _note(self, read: QueueRead) -> QueueRead:
        if read.whole:
            self.pending = QueueRead(self.pending.left | read.left, True)
        elif not self.pending.whole:
            self.pending.changed -= read.left
            self.pending.changed |= read.changed
            self.pending.left |= read.left
        else:
            self.pending.left |= read.left
        return read

    def first(self, limit: int) -> list[QueueEntry]:
        """The first `limit` queued jobs in queue order (as of the last read)."""
        taken: list[QueueEntry] = []
        seen: set[int] = set()
        position = 0
        while position < len(self.order) and len(taken) < limit:
            entry = self.order[position]
            current = self.entries.get(entry.id)
            if current is None or entry.id in seen or queue_order(current) != queue_order(entry):
                # left the queue, or a second copy of a job that left and came back
                del self.order[position]
                continue
            if current is not entry:
                self.order[position] = current  # read again, same place in the queue
            taken.append(current)
            seen.add(current.id)
            position += 1
        return taken

    def ordered(self) -> list[QueueEntry]:
        """Every queued job in queue order."""
        return self.first(len(self.entries))

    def head(self, store: Store, limit: int) -> list[QueueEntry] | None:
        """The first `limit` queued jobs, from what is kept (None: nothing kept yet)."""
        if self.mark is None:
            return None
        self.read(store)
        return self.first(limit)

    def _read_whole(self, store: Store) -> QueueRead:
        before = set(self.entries)
        self.mark, self.order = queued_entries(store)
        self.entries = {e.id: e for e in self.order}
        self.with_reason = {e.id for e in self.order if e.wait_reason is not None}
        self.waits.keep_only(self.entries)
        now_s, monotonic_s = store.now_s(), store.clock.monotonic_s()
        for entry in self.order:
            self.waits.saw(entry, now_s, monotonic_s)
        self._forget(store)
        return self._note(QueueRead(before - set(self.entries), True))

    def _forget(self, store: Store) -> None:
        assert self.mark is not None
        if self.mark - self.forgotten >= FORGET_AFTER:
            forget_queue_changes(store, self.mark)
            self.forgotten = self.mark
