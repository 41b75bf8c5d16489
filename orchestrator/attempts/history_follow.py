"""Keeping each live attempt's metric history in the database, a few new bytes per pass.

progress.jsonl is read from where the last pass stopped (at most MAX_READ_BYTES a pass: a
worker writing faster is followed at its tail). A new attempt's file (nothing stored for it yet)
is read from its beginning, whatever its size: a line too long to be a record is skipped, never
a reason to start reading later. An attempt met for the first time with a history already
stored (a restarted daemon) is read from its last START_BYTES, and what was stored before stays
(writes are idempotent). Points parsed from stdout (attempts.stdout_follow) are handed in by the caller.
When the attempt ends its final metrics (result.json) join the history at its last step, under
names of their own where the run logged the same key (attempts.history_points.final_points).
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.attempts.disk_space import is_disk_full_error
from orchestrator.attempts.divergence import LossSummary, LossTrack
from orchestrator.attempts.history_points import JsonLines, final_points, reported_losses
from orchestrator.attempts.rundir_reads import (
    head_and_tail_texts,
    read_output,
    read_result,
    stat_output,
    text_decoder,
)
from orchestrator.attempts.stdout_follow import LOSS_HEAD_BYTES, LOSS_TAIL_BYTES
from orchestrator.rundir_files import RunDir
from orchestrator.store.db import Store
from orchestrator.store.history import history_keys, last_history_step, record_history
from orchestrator.store.history_bounds import Point

log = logging.getLogger(__name__)

START_BYTES = 4 * 1024 * 1024
MAX_READ_BYTES = 4 * 1024 * 1024


@dataclass
class _Followed:
    offset: int
    keys: set[str]
    looked: bool = False  # the file was looked at once: a later pass may follow a fast writer's tail
    lines: JsonLines = field(default_factory=JsonLines)
    decoder: codecs.IncrementalDecoder = field(default_factory=text_decoder)


class HistoryFollower:
    """One per daemon: attempt id -> how far its progress.jsonl was read, and its history's keys."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._followed: dict[int, _Followed] = {}

    def keep(self, attempt_id: int, run_dir: Path, printed: Sequence[Point], *, ended: bool) -> None:
        """`collect` (or `finish` once the attempt ended); a history that cannot be kept never
        holds up the daemon's pass, but a full disk is raised, to be held like any other write."""
        try:
            if ended:
                self.finish(attempt_id, run_dir, printed)
            else:
                self.collect(attempt_id, run_dir, printed)
        except Exception as exc:
            if is_disk_full_error(exc):
                raise
            log.warning("cannot keep the metric history of attempt %s", attempt_id, exc_info=True)

    def collect(self, attempt_id: int, run_dir: Path, printed: Sequence[Point] = ()) -> int:
        """Store what the attempt reported since the last call; returns how many points."""
        followed = self._followed.get(attempt_id)
        if followed is None:
            followed = _Followed(0, history_keys(self.store, attempt_id))
            self._followed[attempt_id] = followed
        points = list(printed) + self._new_lines(followed, run_dir)
        return record_history(self.store, attempt_id, points, followed.keys) if points else 0

    def _new_lines(self, followed: _Followed, run_dir: Path) -> list[Point]:
        found = stat_output(run_dir, RunDir.PROGRESS)
        if found is None:
            return []
        if found.size_bytes < followed.offset:  # truncated or replaced: read it again
            self._jump(followed, 0)
        if followed.looked:
            start_at = max(0, found.size_bytes - MAX_READ_BYTES)
        else:  # a new attempt's file from its start; a restarted daemon's from near its end
            followed.looked = True
            start_at = max(0, found.size_bytes - START_BYTES) if followed.keys else 0
        if start_at > followed.offset:
            self._jump(followed, start_at)
        if found.size_bytes <= followed.offset:
            return []
        data = read_output(run_dir, followed.offset, min(found.size_bytes - followed.offset, MAX_READ_BYTES),
                           RunDir.PROGRESS)
        followed.offset += len(data)
        return followed.lines.feed(followed.decoder.decode(data))

    @staticmethod
    def _jump(followed: _Followed, offset: int) -> None:
        followed.offset = offset
        followed.decoder = text_decoder()
        followed.lines = JsonLines(skip_first=offset > 0)

    def finish(self, attempt_id: int, run_dir: Path, printed: Sequence[Point] = ()) -> None:
        """The attempt ended: the rest of its progress, then result.json's metrics at its last step.
        A file never read before and longer than one read gives its start and its end."""
        self.collect(attempt_id, run_dir, printed)
        self.collect(attempt_id, run_dir)  # a file still longer than one read: its last part too
        followed = self._followed.pop(attempt_id, None)
        result = read_result(run_dir)
        metrics = result.get("metrics") if isinstance(result, dict) else None
        if isinstance(metrics, dict) and metrics:
            step = last_history_step(self.store, attempt_id)
            if step is None and isinstance(result, dict) and isinstance(result.get("steps"), int):
                step = float(result["steps"])
            known = followed.keys if followed is not None else history_keys(self.store, attempt_id)
            best = result.get("best_step") if isinstance(result, dict) else None
            points = final_points(metrics, step or 0.0, set(known), float(best) if isinstance(best, int) else None)
            record_history(self.store, attempt_id, points, known)

    def keep_only(self, attempt_ids: Iterable[int]) -> None:
        """Forget attempts that are no longer live."""
        live = set(attempt_ids)
        for attempt_id in [a for a in self._followed if a not in live]:
            del self._followed[attempt_id]


def reported_loss_summary(run_dir: Path) -> LossSummary | None:
    """The losses an ended attempt wrote to progress.jsonl, as the divergence rule reads them, NaN
    and infinities kept (its stored history holds finite values only): from the file's head and
    tail, never more than LOSS_HEAD_BYTES + LOSS_TAIL_BYTES of it. None: no loss written."""
    texts = head_and_tail_texts(run_dir, RunDir.PROGRESS, LOSS_HEAD_BYTES, LOSS_TAIL_BYTES)
    track = LossTrack()
    for text in texts or ():
        for loss in reported_losses(text):
            track.add(loss)
    summary = track.summary()
    return summary if summary.steps else None
