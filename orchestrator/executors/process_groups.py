"""Process groups on this host: which are alive, and stopping one (SIGTERM, then SIGKILL).

Every local attempt's wrapper leads its own group (pid.json names it), so stopping an attempt
is stopping its group; orch refuses to signal its own.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import psutil

from orchestrator.errors import LauncherError

log = logging.getLogger(__name__)

POLL_S = 0.05


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    members: list[psutil.Process] = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return members


class ProcessGroups:
    """Which process groups have a live (non-zombie) member, from one read of the process
    table, made at the first question: one per daemon pass serves every group it asks about."""

    def __init__(self) -> None:
        self._members: dict[int, list[int]] | None = None

    def _scan(self) -> dict[int, list[int]]:
        members: dict[int, list[int]] = {}
        for pid in psutil.pids():
            try:
                members.setdefault(os.getpgid(pid), []).append(pid)
            except (ProcessLookupError, PermissionError):
                continue
        return members

    def alive(self, pgid: int) -> bool:
        if self._members is None:
            self._members = self._scan()
        for pid in self._members.get(pgid, ()):
            try:  # only the members of a group asked about are read beyond their pgid
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    return True
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return False


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the group; False when no process of it is left. Refuses orch's own group."""
    if pgid <= 1 or pgid == os.getpgid(0):
        raise LauncherError(f"refusing to kill process group {pgid}: it is not an attempt's group")
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError as exc:
        raise LauncherError(f"cannot signal process group {pgid}: {exc}") from None
    return True


def _wait_gone(pgid: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return True
        time.sleep(POLL_S)
    return not group_members(pgid)


def kill_process_group(pgid: int, grace_s: float = 5.0) -> bool:
    """SIGTERM the group, wait up to `grace_s`, then SIGKILL; True once no member is left."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not signal_group(pgid, sig):  # refuses orch's own group before anything is sent
            return True
        if _wait_gone(pgid, time.monotonic() + wait_s):
            return True
    return False
