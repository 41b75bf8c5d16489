"""Processes of an attempt that left its process group, seen from the wrapper.

A worker may start children that call setsid() or double-fork: they leave the wrapper's
process group, so a group kill misses them, and an orphan is reparented away from the
wrapper's tree, so its GPU memory looks foreign. The wrapper therefore
- joins the attempt's cgroup (ORCH_CGROUP, made by the daemon) before the worker starts, so
  everything the worker starts stays in it whatever session it moves to;
- becomes a child subreaper (Linux prctl): orphans of the worker are reparented to it, not to
  init, so they stay in its tree (their GPU memory counts as the attempt's);
- after the worker exits, ends whatever of its tree is left (SIGTERM, then SIGKILL) before it
  writes exit.json, and names them there.
Every process also carries ORCH_ATTEMPT_MARK in its environment, which the daemon searches
for where there is no cgroup (orchestrator.attempts.containment).
Standard library only: the wrapper runs this before site-packages are loaded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from orchestrator.procstat import read_stat

MARK_VAR = "ORCH_ATTEMPT_MARK"  # in every process of the attempt: how the daemon finds strays
CGROUP_VAR = "ORCH_CGROUP"  # the attempt's cgroup v2 folder, when the daemon could make one
PR_SET_CHILD_SUBREAPER = 36
LEFTOVER_GRACE_S = 2.0  # SIGTERM to what the worker left, then this long, then SIGKILL
POLL_S = 0.05


def become_subreaper() -> bool:
    """Make orphaned descendants ours (reparented here); False where the platform has no such call."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def join_cgroup(folder: str) -> bool:
    """Move this process into the cgroup v2 `folder` (its children inherit it); False when it
    cannot (no such folder, not allowed): the daemon then finds strays by their mark."""
    if not folder:
        return False
    try:
        fd = os.open(os.path.join(folder, "cgroup.procs"), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, b"0")  # 0: the writing process itself
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def descendants(root_pid: int) -> list[int]:
    """Live (non-zombie) descendants of `root_pid`, from one read of /proc."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            stat = read_stat(int(entry))
            if stat is not None and stat.state != "Z":
                children.setdefault(stat.ppid, []).append(int(entry))
    found: list[int] = []
    stack = [root_pid]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.append(child)
                stack.append(child)
    return found


def _name(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text(errors="replace").strip()[:64]
    return "?"


def reap_orphans(worker_pid: int) -> None:
    """Collect orphans reparented to us that have exited (a subreaper's zombies would pile up
    over a long run), never the worker itself: its status is Popen's to collect."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except (ChildProcessError, OSError):
            return
        if info is None or info.si_pid == worker_pid:
            return  # none has exited, or the worker has: the wrapper is about to end anyway
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(info.si_pid, os.WNOHANG)


class OrphanReaper:
    """Calls reap_orphans every `interval_s` on a thread of its own while the worker runs."""

    def __init__(self, worker_pid: int, interval_s: float = 2.0) -> None:
        import threading

        self.worker_pid = worker_pid
        self.interval_s = interval_s
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="reaper", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(self.interval_s * 2)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            reap_orphans(self.worker_pid)


def _reap() -> None:
    """Collect the exit status of orphans reparented to us (they are our children now)."""
    with contextlib.suppress(ChildProcessError, OSError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def end_leftovers(root_pid: int, grace_s: float = LEFTOVER_GRACE_S) -> list[dict[str, object]]:
    """End what is left of `root_pid`'s tree after its worker exited: SIGTERM, `grace_s`, then
    SIGKILL until none is left (a few seconds at most). Returns [{pid, name}] of those found."""
    left = descendants(root_pid)
    found = [{"pid": pid, "name": _name(pid)} for pid in left]
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    for _ in range(200):
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        time.sleep(POLL_S)
        _reap()
        left = descendants(root_pid)
        if time.monotonic() >= deadline:
            sig = signal.SIGKILL
    return found
