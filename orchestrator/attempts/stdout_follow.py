"""Following live attempts' stdout.log for progress, a few new bytes per daemon pass.

Used for workers that write no progress.jsonl. Each pass reads only what was appended since the
last one (at most MAX_READ_BYTES: a script printing faster than that is followed at its tail);
an attempt met for the first time (a restarted daemon) is read from its last TAIL_START_BYTES.
Reads go through the run-dir module; the parsing is the pure `attempts.printed_metrics`.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.attempts.divergence import LossSummary, LossTrack
from orchestrator.attempts.printed_metrics import StdoutProgress, printed_losses
from orchestrator.attempts.rundir_reads import (
    head_and_tail_texts,
    read_output,
    stat_output,
    text_decoder,
)
from orchestrator.plans.template import OUR_WORKERS
from orchestrator.rundir_files import RunDir
from orchestrator.store.history_bounds import Point

TAIL_START_BYTES = 64 * 1024
MAX_READ_BYTES = 1024 * 1024
LOSS_HEAD_BYTES = 256 * 1024  # an ended attempt's losses: its first steps from here ...
LOSS_TAIL_BYTES = 1024 * 1024  # ... its last ones (and minimum) from here


def follows_stdout(worker: str) -> bool:
    """Whether a worker's progress is read from its stdout: not for ours, which write
    progress.jsonl (their stdout holds loading bars, not training steps, before it appears)."""
    return worker not in OUR_WORKERS


@dataclass
class _Followed:
    offset: int
    parser: StdoutProgress
    decoder: codecs.IncrementalDecoder = field(default_factory=text_decoder)


class OutputFollower:
    """One per daemon: attempt id -> how far its stdout.log has been read, and what it said."""

    def __init__(self) -> None:
        self._followed: dict[int, _Followed] = {}

    def progress(self, attempt_id: int, run_dir: Path, progress_regex: str | None) -> dict[str, Any] | None:
        """The attempt's progress as its output says it so far; None before anything is understood."""
        found = stat_output(run_dir)
        followed = self._followed.get(attempt_id)
        if found is None:
            return followed.parser.snapshot() if followed is not None else None
        if followed is None:
            followed = _Followed(0, StdoutProgress.with_regex(progress_regex))
            self._followed[attempt_id] = followed
            self._jump(followed, max(0, found.size_bytes - TAIL_START_BYTES))
        if found.size_bytes < followed.offset:  # truncated or replaced: start again
            self._jump(followed, 0)
        if found.size_bytes - followed.offset > MAX_READ_BYTES:
            self._jump(followed, found.size_bytes - MAX_READ_BYTES)
        if found.size_bytes > followed.offset:
            data = read_output(run_dir, followed.offset, found.size_bytes - followed.offset)
            followed.offset += len(data)
            followed.parser.feed(followed.decoder.decode(data))
        return followed.parser.snapshot()

    @staticmethod
    def _jump(followed: _Followed, offset: int) -> None:
        followed.offset = offset
        followed.decoder = text_decoder()
        followed.parser.resync(mid_line=offset > 0)

    def take_points(self, attempt_id: int, ended: bool = False) -> list[Point]:
        """History points its output gave since the last call (attempts.history_follow stores
        them); `ended`: its output is complete, nothing waits for a later line."""
        followed = self._followed.get(attempt_id)
        return followed.parser.take_points(flush=ended) if followed is not None else []

    def keep_only(self, attempt_ids: Iterable[int]) -> None:
        """Forget attempts that are no longer live."""
        live = set(attempt_ids)
        for attempt_id in [a for a in self._followed if a not in live]:
            del self._followed[attempt_id]


def printed_loss_summary(run_dir: Path, progress_regex: str | None) -> LossSummary | None:
    """The training losses an ended attempt printed, as the divergence rule reads them: scanned
    (`printed_losses`) from the head of stdout.log (its first steps) and its tail (its last steps
    and, with the head, its minimum), never more than LOSS_HEAD_BYTES + LOSS_TAIL_BYTES of it.
    None: no loss printed. (The follower reads live attempts only: a short script may end before
    a pass has read any of its output.)"""
    texts = head_and_tail_texts(run_dir, RunDir.LOG, LOSS_HEAD_BYTES, LOSS_TAIL_BYTES)
    if texts is None:
        return None
    pattern = re.compile(progress_regex) if progress_regex else None
    track = LossTrack()
    for text in texts:
        for loss in printed_losses(text, pattern):
            track.add(loss)
    summary = track.summary()
    return summary if summary.steps else None
