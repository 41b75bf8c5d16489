"""Finding the checkpoint a new attempt resumes from, in the run dirs of the job's earlier attempts.

The Hugging Face convention: a checkpoint is a folder `checkpoint-N` (N the optimizer step) in
the run dir or in an output dir below it (`--output_dir {run_dir}/out`). The latest is the one
with the highest N in the most recent attempt that left any: an attempt that resumed from
attempt 1's checkpoint and died before writing its own leaves attempt 1's as the latest.

Run dirs are written by user code, so the search trusts nothing there: every level is opened
with O_NOFOLLOW relative to its parent's descriptor, starting from the runs tree's checked run
dir (runtree), so a symlink is never followed and a folder found is provably inside that run
dir; the search is bounded in depth and in directory entries read. Trainer saves that died
half-way are skipped: where some checkpoint holds `trainer_state.json` (which the Trainer
writes last), one without it is incomplete.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import LauncherError

CHECKPOINT_NAME = re.compile(r"^checkpoint-([0-9]{1,12})$")
HF_COMPLETE_MARKER = "trainer_state.json"
MAX_DEPTH = 3  # checkpoint-N at most this many levels below the run dir (run_dir/out/sub/checkpoint-N)
MAX_ENTRIES = 4096  # directory entries read per run dir, in all: a huge tree is searched in part
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Checkpoint:
    attempt_n: int  # the attempt whose run dir holds it
    step: int  # N of checkpoint-N
    path: Path  # run dir / the folders below it


@dataclass
class _Budget:
    entries_left: int


def latest_checkpoint(previous: Iterable[tuple[int, Path]]) -> Checkpoint | None:
    """The checkpoint to resume from: the latest one in the most recent of `previous`
    ((attempt n, run dir) of the job's earlier attempts, any order) that holds one."""
    for attempt_n, run_dir in sorted(previous, key=lambda item: item[0], reverse=True):
        found = find_in_run_dir(attempt_n, Path(run_dir))
        if found is not None:
            return found
    return None


def find_in_run_dir(attempt_n: int, run_dir: Path) -> Checkpoint | None:
    """The complete checkpoint-N with the highest N in `run_dir` (up to MAX_DEPTH below it);
    None when there is none, or the run dir is missing or not safe to read."""
    from orchestrator.launch.runtree import open_run_dir

    try:
        with open_run_dir(run_dir) as dir_fd:
            candidates: list[tuple[int, tuple[str, ...], bool]] = []
            _search(dir_fd, (), 1, _Budget(MAX_ENTRIES), candidates)
    except (OSError, LauncherError):
        return None
    if any(marked for _, _, marked in candidates):  # a Trainer's: unmarked ones died mid-save
        candidates = [c for c in candidates if c[2]]
    if not candidates:
        return None
    step, names, _ = max(candidates, key=lambda c: (c[0], c[1]))
    return Checkpoint(attempt_n, step, run_dir.joinpath(*names))


def _search(
    dir_fd: int, names: tuple[str, ...], depth: int, budget: _Budget,
    found: list[tuple[int, tuple[str, ...], bool]],
) -> None:  # fmt: skip
    """Collect (N, path names, has the Trainer's marker) of the non-empty checkpoint-N folders
    below `dir_fd`; descends into other folders up to MAX_DEPTH."""
    for name, is_dir in _entries(dir_fd, budget):
        match = CHECKPOINT_NAME.match(name)
        if not is_dir or (match is None and depth >= MAX_DEPTH):
            continue
        child = _open_child(dir_fd, name)
        if child is None:
            continue
        try:
            if match is None:
                _search(child, (*names, name), depth + 1, budget, found)
                continue
            contents = {entry for entry, _ in _entries(child, budget)}
            if contents:
                found.append((int(match.group(1)), (*names, name), HF_COMPLETE_MARKER in contents))
        finally:
            os.close(child)


def _entries(dir_fd: int, budget: _Budget) -> list[tuple[str, bool]]:
    """(name, is a real directory) of a directory's entries, no more than the budget has left
    (it is charged for them). A symlink is never a directory here."""
    entries: list[tuple[str, bool]] = []
    with contextlib.suppress(OSError), os.scandir(dir_fd) as scan:
        for entry in scan:
            if budget.entries_left <= 0:
                break
            budget.entries_left -= 1
            with contextlib.suppress(OSError):
                entries.append((entry.name, entry.is_dir(follow_symlinks=False)))
    return entries


def _open_child(dir_fd: int, name: str) -> int | None:
    """A descriptor of the real directory `name` in `dir_fd`, owned by us; None for a symlink,
    a file, or anything else."""
    try:
        child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    info = os.fstat(child)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        os.close(child)
        return None
    return child
