"""Who may write into a run dir, and which of its checkpoints a resume reads. No torch here.

A warm process (`share_base`) trains a job on behalf of a thin client; when that client is
killed, the job goes on in the warm process until it notices (its next progress line, or at
most STOP_GRACE_S later, when the process exits). Meanwhile orch has picked a checkpoint of that
run dir for the next attempt. So:

- the warm process holds an exclusive flock on the job's lock file, `job-DIGEST.lock` in the
  share folder (DIGEST: of the run dir's resolved path), for as long as it trains the job; the
  kernel drops it when the process dies;
- a worker resuming from a checkpoint first takes that lock for the checkpoint's run dir (with
  a deadline): once it has it, nothing writes there any more;
- if the checkpoint orch named is gone by then (the old job finished a save after orch picked
  it, and removed the older one), a newer whole checkpoint of the same run dir is the same run
  further on (a resume is exact): it is used, and the log and result.json say so.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from workers.lora.share import SHARE_DIR_VAR, share_dir, try_lock

CHECKPOINT_NAME = re.compile(r"^checkpoint-([0-9]+)$")  # as workers.lora.checkpoint names them
STATE_FILE = "state.json"  # written last: a folder holding it is a whole checkpoint
# A stopped job ends within the warm process's stop grace (30 s) or the process exits; the rest
# is room for a loaded machine to deliver the stop and the exit.
WAIT_DEADLINE_S = 45.0
POLL_S = 0.2


class ResumeBlocked(Exception):
    """The run dir's old job did not stop within the deadline, or its checkpoint is gone."""


@dataclass(frozen=True)
class ResumePoint:
    checkpoint: Path
    note: str | None  # why it is not the one the config named; None when it is


def job_lock_path(folder: Path, run_dir: Path) -> Path:
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:24]
    return folder / f"job-{digest}.lock"


def lock_folder(env: Mapping[str, str]) -> Path | None:
    """The share folder orch names (ORCH_SHARE_DIR), or None when it names none: no warm
    process of this runs dir can have trained the job then."""
    return share_dir(env) if env.get(SHARE_DIR_VAR) else None


@contextmanager
def holding_job(run_dir: Path, env: Mapping[str, str], log: Callable[[str], None] = print) -> Iterator[None]:
    """Hold the job's lock while the body trains it (the warm process's side). A lock another
    holds (an old job of the run dir still stopping) is not waited for: the job trains unguarded
    and `log` says so. OSError when the lock file cannot be opened."""
    folder = lock_folder(env)
    path = job_lock_path(folder, run_dir) if folder is not None else None
    fd = try_lock(path) if path is not None else None
    if path is not None and fd is None:
        log(f"the lock of {run_dir} is held by another process: this job trains unguarded "
            f"(a resume of it does not wait for it)")  # fmt: skip
    try:
        yield
    finally:
        if path is not None and fd is not None:
            _let_go(path, fd)


def wait_until_stopped(run_dir: Path, env: Mapping[str, str], log: Callable[[str], None],
                       deadline_s: float = WAIT_DEADLINE_S) -> None:  # fmt: skip
    """Return once no warm process trains the job of `run_dir` (its lock taken and let go);
    ResumeBlocked after `deadline_s`."""
    folder = lock_folder(env)
    if folder is None:
        return
    path = job_lock_path(folder, run_dir)
    fd = try_lock(path)
    if fd is None:
        log(f"waiting up to {deadline_s:g} s for the job still training in {run_dir} (its attempt "
            f"ended) to stop: lock {path}")  # fmt: skip
        started = time.monotonic()
        while fd is None and time.monotonic() - started < deadline_s:
            time.sleep(POLL_S)  # flock has no timeout: poll the non-blocking try
            fd = try_lock(path)
        if fd is None:
            raise ResumeBlocked(f"the job still training in {run_dir} did not stop within {deadline_s:g} s")
        log(f"it stopped after {time.monotonic() - started:.1f} s")
    _let_go(path, fd)  # taken once: whoever trained there has stopped; nothing starts there again


def _let_go(path: Path, fd: int) -> None:
    """Remove the lock file, then release it: one who waits on it (opened before the removal)
    gets it at the release, one who opens it afterwards makes a free one, alike correct. A
    process that dies leaves its file; the next waiter removes it."""
    with contextlib.suppress(OSError):
        path.unlink()
    os.close(fd)


def resume_point(named: Path) -> ResumePoint:
    """The checkpoint to resume from: `named` while it is whole, else the newest whole one of
    its run dir past it (the same run further on); ResumeBlocked when there is none."""
    if _whole(named):
        return ResumePoint(named, None)
    match = CHECKPOINT_NAME.match(named.name)
    step = int(match.group(1)) if match else None
    later = sorted((int(m.group(1)), p) for p in _entries(named.parent)
                   if (m := CHECKPOINT_NAME.match(p.name)) and _whole(p))  # fmt: skip
    later = [(n, p) for n, p in later if step is not None and n > step]
    if not later:
        raise ResumeBlocked(f"{named} is gone and its run dir holds no later whole checkpoint")
    newest = later[-1][1]
    return ResumePoint(newest, f"{named} is gone (the job that wrote it saved {newest.name} after "
                               f"orch picked it, then stopped): resuming from {newest}")  # fmt: skip


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


def _whole(folder: Path) -> bool:
    state = folder / STATE_FILE
    return not folder.is_symlink() and folder.is_dir() and state.is_file() and not state.is_symlink()
