"""Finding the checkpoint a new attempt resumes from, in the run dirs of the job's earlier attempts.

The Hugging Face convention: a checkpoint is a folder `checkpoint-N` (N the optimizer step) in
the run dir or in an output dir below it (`--output_dir {run_dir}/out`). The latest is the one
with the highest N in the most recent attempt that left any: an attempt that resumed from
attempt 1's checkpoint and died before writing its own leaves attempt 1's as the latest.

Run dirs are written by user code, so the search trusts nothing there: every level is opened
with O_NOFOLLOW relative to its parent's descriptor, starting from the runs tree's checked run
dir (runtree), so a symlink is never followed and a folder found is provably inside that run
dir; the search is bounded in depth and in directory entries read (checkpoint-N folders and
likely output dirs are visited first; a search that ran out says so in the attempt's start
event). A folder is a checkpoint only when it is whole: for a worker whose marker file is known
(the LoRA worker's `state.json`, plans.resume.checkpoint_marker) only a folder that holds it;
for any other script, a Trainer save (it holds `training_args.bin`) only with the
`trainer_state.json` the Trainer writes last, and where some checkpoint of any earlier attempt
holds `trainer_state.json`, every one without it is taken as incomplete.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import LauncherError

CHECKPOINT_NAME = re.compile(r"^checkpoint-([0-9]{1,12})$")
HF_COMPLETE_MARKER = "trainer_state.json"
# The Trainer saves the model and its training_args.bin first and trainer_state.json last: a
# folder with the first and not the last is a Trainer save cut short, whatever other folders hold.
HF_ARGS_FILE = "training_args.bin"
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
    ran_out: bool = False  # some directory was read only in part


@dataclass(frozen=True)
class _Candidate:
    attempt_n: int
    step: int
    names: tuple[str, ...]  # the folders from the run dir down to checkpoint-N
    marked: bool  # holds the marker file (a real file): the worker's own, else the Trainer's


@dataclass(frozen=True)
class CheckpointSearch:
    checkpoint: Checkpoint | None
    searched_in_part: tuple[int, ...] = ()  # attempts (n) whose run dir outran MAX_ENTRIES


# Folders a checkpoint is likely in (output_dir names), searched before any other folder.
LIKELY_OUTPUT_DIRS = ("out", "output", "outputs", "output_dir", "checkpoints", "ckpt", "results", "model")


def latest_checkpoint(
    previous: Iterable[tuple[int, Path]], marker: str | None = None
) -> Checkpoint | None:
    """The checkpoint to resume from among `previous` ((attempt n, run dir) of the job's earlier
    attempts, any order); see search_checkpoints."""
    return search_checkpoints(previous, marker).checkpoint


def search_checkpoints(
    previous: Iterable[tuple[int, Path]], marker: str | None = None
) -> CheckpointSearch:
    """Candidates are gathered from every attempt first. With the worker's own `marker` file
    name, a folder without it is never one; without, where any holds the Trainer's marker, every
    unmarked one is dropped (a save that died half-way, in whichever attempt). Then the most
    recent attempt's highest step wins."""
    candidates: list[_Candidate] = []
    in_part: list[int] = []
    run_dirs = dict(previous)
    for attempt_n in sorted(run_dirs, reverse=True):
        run_dir = Path(run_dirs[attempt_n])
        found, ran_out = _candidates_in(attempt_n, run_dir, marker or HF_COMPLETE_MARKER)
        candidates.extend(found)
        if ran_out:
            in_part.append(attempt_n)
    if marker is not None or any(c.marked for c in candidates):
        candidates = [c for c in candidates if c.marked]
    if not candidates:
        return CheckpointSearch(None, tuple(in_part))
    best = max(candidates, key=lambda c: (c.attempt_n, c.step, c.names))
    return CheckpointSearch(
        Checkpoint(best.attempt_n, best.step, Path(run_dirs[best.attempt_n]).joinpath(*best.names)),
        tuple(in_part),
    )


def checkpoint_step(path: str | None) -> int | None:
    """N of a checkpoint-N folder's path; None for no path or another name."""
    if path is None:
        return None
    match = CHECKPOINT_NAME.match(path.rstrip("/").rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def find_in_run_dir(attempt_n: int, run_dir: Path, marker: str | None = None) -> Checkpoint | None:
    """The complete checkpoint-N with the highest N in `run_dir` (up to MAX_DEPTH below it);
    None when there is none, or the run dir is missing or not safe to read."""
    return search_checkpoints([(attempt_n, run_dir)], marker).checkpoint


def _candidates_in(attempt_n: int, run_dir: Path, marker: str) -> tuple[list[_Candidate], bool]:
    """The non-empty checkpoint-N folders of one run dir, and whether the budget ran out."""
    from orchestrator.executors.runs_tree import open_run_dir

    found: list[tuple[int, tuple[str, ...], bool]] = []
    budget = _Budget(MAX_ENTRIES)
    try:
        with open_run_dir(run_dir) as dir_fd:
            _search(dir_fd, (), 1, budget, found, marker=marker)
    except (OSError, LauncherError):
        return [], False
    return [_Candidate(attempt_n, step, names, marked) for step, names, marked in found], budget.ran_out


def remove_checkpoints(run_dirs: Iterable[Path]) -> list[Path]:
    """Delete the checkpoint-N folders in `run_dirs` (a succeeded job's earlier attempts: no
    attempt will resume from them), found by the same bounded walk that never follows a
    symlink; each folder is removed relative to its parent's descriptor. The folders removed."""
    from orchestrator.executors.runs_tree import open_run_dir

    removed: list[Path] = []
    for run_dir in run_dirs:
        found: list[tuple[int, tuple[str, ...], bool]] = []
        with contextlib.suppress(OSError, LauncherError), open_run_dir(Path(run_dir)) as dir_fd:
            _search(dir_fd, (), 1, _Budget(MAX_ENTRIES), found, remove=True)
        removed.extend(Path(run_dir).joinpath(*names) for _, names, _ in found)
    return removed


def _visit_order(name: str) -> tuple[int, str]:
    """checkpoint-N folders first, then likely output dirs, then the rest (by name)."""
    if CHECKPOINT_NAME.match(name):
        return (0, name)
    return (1 if name.lower() in LIKELY_OUTPUT_DIRS else 2, name)


def _search(
    dir_fd: int, names: tuple[str, ...], depth: int, budget: _Budget,
    found: list[tuple[int, tuple[str, ...], bool]], remove: bool = False,
    marker: str = HF_COMPLETE_MARKER,
) -> None:  # fmt: skip
    """Collect (N, path names, holds `marker`) of the non-empty checkpoint-N folders
    below `dir_fd` (with `remove`: every checkpoint-N folder, deleted); descends into other
    folders up to MAX_DEPTH."""
    for name, is_dir in sorted(_entries(dir_fd, budget), key=lambda entry: _visit_order(entry[0])):
        match = CHECKPOINT_NAME.match(name)
        if not is_dir or (match is None and depth >= MAX_DEPTH):
            continue
        child = _open_child(dir_fd, name)
        if child is None:
            continue
        try:
            if match is None:
                _search(child, (*names, name), depth + 1, budget, found, remove, marker)
            elif remove:
                with contextlib.suppress(OSError):  # shutil.rmtree(dir_fd=) never follows a link
                    shutil.rmtree(name, dir_fd=dir_fd)
                    found.append((int(match.group(1)), (*names, name), False))
            elif _entries(child, budget, limit=1):
                marked = _has_marker(child, marker)
                trainer_save = marker == HF_COMPLETE_MARKER and _has_marker(child, HF_ARGS_FILE)
                if marked or not trainer_save:  # a Trainer save without its last file is cut short
                    found.append((int(match.group(1)), (*names, name), marked))
        finally:
            os.close(child)


def _has_marker(dir_fd: int, marker: str) -> bool:
    """The folder holds `marker` as a regular file (a link to one does not count)."""
    try:
        info = os.stat(marker, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode)


def _entries(dir_fd: int, budget: _Budget, limit: int | None = None) -> list[tuple[str, bool]]:
    """(name, is a real directory) of a directory's entries (at most `limit`), no more than the
    budget has left (it is charged for them). A symlink is never a directory here."""
    entries: list[tuple[str, bool]] = []
    with contextlib.suppress(OSError), os.scandir(dir_fd) as scan:
        for entry in scan:
            if limit is not None and len(entries) >= limit:
                break
            if budget.entries_left <= 0:
                budget.ran_out = True
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
