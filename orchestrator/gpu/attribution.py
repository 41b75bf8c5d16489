"""Which GPU memory belongs to which attempt: the memory of its process tree."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

import psutil

from orchestrator.procstat import read_stat


def process_tree_pids(pid: int) -> frozenset[int]:
    """`pid` and all its live descendants; empty when `pid` is gone."""
    try:
        root = psutil.Process(pid)
        children = root.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return frozenset()
    return frozenset([pid, *(child.pid for child in children)])


class TreeMembers:
    """Which of the pids a GPU reports belong to one root: those in the session it leads (one
    syscall each; this also keeps a grandchild orphaned to init), else those whose ancestry,
    walked up through /proc, reaches it. Not a scan of the host's whole process table per
    question: a wrapper asks every second, and forty of them scanning a busy host took a third
    of a core. A process found outside stays outside for as long as it lives (keyed by pid and
    start time): a process is never adopted into another tree, only reparented to init or a
    subreaper."""

    MAX_DEPTH = 64

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self._outside: set[tuple[int, int]] = set()
        try:
            self._root_sid = os.getsid(root_pid) if os.getsid(root_pid) == root_pid else None
        except OSError:
            self._root_sid = None

    def among(self, pids: Iterable[int]) -> frozenset[int]:
        """Those of `pids` that are the root or its live descendants."""
        if not _exists(self.root_pid):
            return frozenset()
        members: set[int] = set()
        for pid in pids:
            if pid == self.root_pid or self._inside(pid):
                members.add(pid)
        return frozenset(members)

    def _inside(self, pid: int) -> bool:
        if pid <= 0:
            return False  # memory of processes not ours (sim GPUs' foreign pid 0); getsid(0) is our own
        if self._root_sid is not None:
            with contextlib.suppress(OSError):
                if os.getsid(pid) == self._root_sid:
                    return True  # the root leads the session: one syscall for most members
        here = read_stat(pid)
        if here is None:
            return False
        key = (pid, here.start_ticks)
        if key in self._outside:
            return False
        parent = here.ppid
        for _ in range(self.MAX_DEPTH):
            if parent == self.root_pid:
                return True
            if parent <= 1:
                break
            up = read_stat(parent)
            if up is None:
                break
            parent = up.ppid
        self._outside.add(key)
        return False

    def forget_except(self, pids: Iterable[int]) -> None:
        """Keep what is known only of processes still reported (a pid's entry goes with it)."""
        keep = set(pids)
        self._outside = {key for key in self._outside if key[0] in keep}


def _ppid_map() -> dict[int, int]:
    """pid -> parent pid of every process: psutil's own fast table where the platform has one
    (what `Process.children` reads), else one process_iter."""
    fast = getattr(getattr(psutil, "_psplatform", None), "ppid_map", None)
    if fast is not None:
        with contextlib.suppress(Exception):
            return {int(k): int(v) for k, v in fast().items()}
    return {p.pid: int(p.info["ppid"]) for p in psutil.process_iter(["ppid"]) if p.info.get("ppid") is not None}


def _exists(pid: int) -> bool:
    """Whether a process `pid` exists now: one kill(pid, 0), not psutil's read of /proc (asked
    per live attempt per pass). A thread id that is not a process counts as one here, and then
    has no children in the scan."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


class ProcessTrees:
    """Process trees of many roots from one scan of the process table (a scan per root costs
    milliseconds each on a busy host). The scan is kept from pass to pass for callers that do not
    ask for a fresh one, while every root and every process the GPUs report is in it: GPU memory
    of a new process is never missed, and host readings ask for a fresh scan."""

    def __init__(self) -> None:
        self._children: dict[int, list[int]] | None = None
        self._known: set[int] = set()
        self._this_pass = False  # the scan was made in this pass

    def _scan(self) -> dict[int, list[int]]:
        children: dict[int, list[int]] = {}
        for pid, ppid in _ppid_map().items():
            children.setdefault(ppid, []).append(pid)
        return children

    def new_pass(self, reported_pids: Iterable[int] = ()) -> None:
        """A new pass; `reported_pids`: the processes the GPUs report now."""
        self._this_pass = False
        if any(pid not in self._known for pid in reported_pids):
            self._children = None

    def pids(self, pid: int, fresh: bool = True) -> frozenset[int]:
        """`pid` and its descendants as of the scan (made in this pass when `fresh`); empty when
        `pid` is gone now."""
        if not _exists(pid):
            return frozenset()
        if self._children is None or pid not in self._known or (fresh and not self._this_pass):
            self._children = self._scan()
            self._known = set(self._children).union(*self._children.values())
            self._this_pass = True
        found, stack = {pid}, [pid]
        while stack:
            for child in self._children.get(stack.pop(), ()):
                if child not in found:
                    found.add(child)
                    stack.append(child)
        return frozenset(found)
