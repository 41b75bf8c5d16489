"""Finding and ending every process of an attempt, those that left its process group too.

A worker's child may call setsid() or double-fork: a process-group kill misses it. Where the
daemon can make cgroup v2 folders (root on a host with a writable unified hierarchy) each
attempt gets one, which the wrapper joins before the worker starts; `cgroup.kill` then ends
all of it, whatever session a process moved to. Elsewhere every process of the attempt is
found by the mark in its environment (ORCH_ATTEMPT_MARK, unique per runs dir and attempt),
which children inherit whatever they do to their session. The daemon closes an attempt only
once neither way finds a live process (kills.GroupStopper for the group first).

`plan_stop` is the pure core (the same steps as a group's stop, kills.next_step); `StrayHunter`
reads /proc and the cgroup, sends the signals, and remembers what it had to hunt.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import signal
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from orchestrator.attempts.kills import KillState, KillStep, after, next_step
from orchestrator.clock import Clock
from orchestrator.executors.observation import Observation
from orchestrator.executors.wrapper.strays import CGROUP_VAR, MARK_VAR
from orchestrator.procstat import read_stat
from orchestrator.store.attempts import update_attempt
from orchestrator.store.db import Store
from orchestrator.store.jobs import add_event
from orchestrator.store.rows import Attempt

log = logging.getLogger(__name__)

STRAY_GRACE_S = 2.0  # a stray already outlived its group: SIGTERM, this long, then SIGKILL
CGROUP_CANDIDATES = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
CGROUP_PARENT = "orch"
TRACKING_VAR = "ORCH_TRACKING"  # "environment": find strays by their mark only, make no cgroups


class Tracking(str, Enum):
    CGROUP = "cgroup"  # the attempt's cgroup v2 folder
    ENVIRONMENT = "environment"  # the mark every process of the attempt inherits


def runs_key(runs_dir: Path) -> str:
    """Short, stable, unique per runs dir (hence per database), from the folder's identity
    (device, inode): one folder reached by two paths (a bind mount) has one key, so a daemon
    started through either finds the other's strays."""
    try:
        info = os.stat(runs_dir)
    except OSError:
        return legacy_runs_key(runs_dir)  # not made yet: nothing can carry its key
    return hashlib.sha256(f"{info.st_dev}:{info.st_ino}".encode()).hexdigest()[:12]


def legacy_runs_key(runs_dir: Path) -> str:
    """The key from the folder's resolved path, which orch's marks carried before `runs_key`:
    still searched, so attempts started by an earlier orch are found after an upgrade."""
    return hashlib.sha256(str(Path(runs_dir).resolve()).encode()).hexdigest()[:12]


def runs_keys(runs_dir: Path) -> tuple[str, ...]:
    return tuple(dict.fromkeys((runs_key(runs_dir), legacy_runs_key(runs_dir))))


def attempt_mark(runs_dir: Path, attempt_id: int) -> str:
    return f"{runs_key(runs_dir)}-{attempt_id}"


@functools.lru_cache(maxsize=1)
def cgroup_parent() -> Path | None:
    """orch's folder in a writable cgroup v2 hierarchy, made on first use; None where there is
    none (not root, cgroup v1 only, a container without one)."""
    if os.environ.get(TRACKING_VAR) == Tracking.ENVIRONMENT.value:
        return None  # asked for the mark alone (no cgroups made)
    for base in CGROUP_CANDIDATES:
        if not (base / "cgroup.procs").is_file() or not (base / "cgroup.subtree_control").is_file():
            continue  # not a cgroup v2 mount
        parent = base / CGROUP_PARENT
        try:
            parent.mkdir(exist_ok=True)
        except OSError:
            continue
        if (parent / "cgroup.procs").is_file():
            # memory.events in each attempt's folder (the kernel's OOM kills, read by the
            # wrapper) needs the memory controller there; where it cannot be had, it is absent
            with contextlib.suppress(OSError):
                (parent / "cgroup.subtree_control").write_text("+memory")
            return parent
    return None


def attempt_cgroup(runs_dir: Path, attempt_id: int) -> Path | None:
    parent = cgroup_parent()
    return None if parent is None else parent / f"a-{attempt_mark(runs_dir, attempt_id)}"


def tracking_env(runs_dir: Path, attempt_id: int, *, cgroup: bool = True) -> dict[str, str]:
    """What an attempt's environment carries to be found again: its mark, and (`cgroup`: it runs
    on this host) its cgroup folder when one could be made (the wrapper joins it)."""
    env = {MARK_VAR: attempt_mark(runs_dir, attempt_id)}
    folder = attempt_cgroup(runs_dir, attempt_id) if cgroup else None
    if folder is not None:
        with contextlib.suppress(OSError):
            folder.mkdir(exist_ok=True)
            env[CGROUP_VAR] = str(folder)
    return env


def remove_empty_cgroups(runs_dir: Path) -> int:
    """Remove this runs dir's attempt folders that hold no process (left by a daemon that was
    killed, or attempts closed without a hunt); one with processes refuses (EBUSY) and stays.
    Returns how many stay."""
    parent = cgroup_parent()
    if parent is None:
        return 0
    staying = 0
    with contextlib.suppress(OSError):
        for key in runs_keys(runs_dir):
            for folder in parent.glob(f"a-{key}-*"):
                try:
                    folder.rmdir()
                except OSError:
                    staying += 1
    return staying


def cgroup_pids(folder: Path) -> list[int]:
    with contextlib.suppress(OSError, ValueError):
        return [int(line) for line in (folder / "cgroup.procs").read_text().split()]
    return []


def marked_pids(keys: tuple[str, ...]) -> dict[str, list[int]]:
    """mark -> live pids whose environment carries an attempt mark of a runs dir key in `keys`,
    from one read of /proc (this user's processes; every process as root)."""
    found: dict[str, list[int]] = {}
    prefixes = [f"{MARK_VAR}={key}-".encode() for key in keys]
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read(1 << 20)
        except OSError:
            continue
        start = next((at for at in map(environ.find, prefixes) if at == 0 or (at > 0 and environ[at - 1] == 0)), -1)
        if start < 0:
            continue
        end = environ.find(b"\0", start)
        mark = environ[start + len(MARK_VAR) + 1 : end if end >= 0 else None].decode("ascii", "replace")
        stat = read_stat(entry)
        if stat is not None and stat.state != "Z":
            found.setdefault(mark, []).append(int(entry))
    return found


@dataclass
class Hunt:
    """One attempt's strays being ended: what was sent, which pids were found, how."""

    state: KillState = field(default_factory=KillState)
    found: dict[int, str] = field(default_factory=dict)  # pid -> name
    tracking: Tracking = Tracking.ENVIRONMENT


def plan_stop(hunt: Hunt, alive: bool, now_s: float) -> KillStep:
    """Pure: the next step for an attempt's strays (kills.next_step with the strays' grace)."""
    return next_step(hunt.state, alive, now_s, STRAY_GRACE_S)


def _name(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text(errors="replace").strip()[:64]
    return "?"


class StrayHunter:
    """The hunts under way, keyed by attempt id. `new_pass` once per daemon pass; `stop` for an
    attempt whose process group is gone; `stop` never waits."""

    def __init__(self, clock: Clock, runs_dir: Path) -> None:
        self.clock = clock
        self.runs_dir = runs_dir
        self._hunts: dict[int, Hunt] = {}
        self._marked: dict[str, list[int]] | None = None
        self._swept = False

    def new_pass(self) -> None:
        self._marked = None  # /proc is read again at the first question of the pass
        if not self._swept:  # the first pass (the daemon holds its lock): what earlier ones left
            self._swept = True
            remove_empty_cgroups(self.runs_dir)

    def _members(self, attempt_id: int) -> tuple[list[int], Tracking]:
        folder = attempt_cgroup(self.runs_dir, attempt_id)
        in_cgroup = folder is not None and folder.is_dir()
        pids = set(cgroup_pids(folder)) if folder is not None and in_cgroup else set()
        if self._marked is None:
            self._marked = marked_pids(runs_keys(self.runs_dir))
        for key in runs_keys(self.runs_dir):
            pids.update(self._marked.get(f"{key}-{attempt_id}", ()))
        pids.discard(os.getpid())
        return sorted(pids), Tracking.CGROUP if in_cgroup else Tracking.ENVIRONMENT

    def stop(self, attempt_id: int) -> bool:
        """Move the end of the attempt's strays one step on; True once none lives (its cgroup
        folder is then removed)."""
        pids, tracking = self._members(attempt_id)
        hunt = self._hunts.get(attempt_id)
        if not pids:
            self._cleanup(attempt_id)
            return True
        if hunt is None:
            hunt = self._hunts[attempt_id] = Hunt(tracking=tracking)
            log.warning("attempt %s: %d process(es) outside its process group still live (pids %s); ending them",
                        attempt_id, len(pids), ", ".join(map(str, pids)))
        for pid in pids:
            hunt.found.setdefault(pid, _name(pid))
        now = self.clock.monotonic_s()
        step = plan_stop(hunt, True, now)
        if step in (KillStep.TERM, KillStep.KILL):
            self._send(attempt_id, pids, signal.SIGTERM if step is KillStep.TERM else signal.SIGKILL, tracking)
            hunt.state = after(hunt.state, step, now)
        return False

    def _send(self, attempt_id: int, pids: list[int], sig: int, tracking: Tracking) -> None:
        folder = attempt_cgroup(self.runs_dir, attempt_id)
        if sig == signal.SIGKILL and tracking is Tracking.CGROUP and folder is not None:
            with contextlib.suppress(OSError):
                (folder / "cgroup.kill").write_text("1")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _cleanup(self, attempt_id: int) -> None:
        folder = attempt_cgroup(self.runs_dir, attempt_id)
        if folder is not None:
            with contextlib.suppress(OSError):
                folder.rmdir()

    def hunted(self, attempt_id: int) -> str | None:
        """What had to be hunted for this attempt, in one line (None: nothing); kept until the
        attempt is closed (keep_only), so an end whose write failed says it again."""
        hunt = self._hunts.get(attempt_id)
        if hunt is None or not hunt.found:
            return None
        return describe(hunt.found, f"found by its {hunt.tracking.value}", "by orch after its process group ended")

    def keep_only(self, attempt_ids: set[int]) -> None:
        self._hunts = {k: v for k, v in self._hunts.items() if k in attempt_ids}


def describe(found: dict[int, str], how: str, when: str) -> str:
    """'2 processes outside its process group were ended by ... (pids 12 python, 13 sleep; found by its cgroup)'."""
    shown = ", ".join(f"{pid} {name}" for pid, name in list(found.items())[:8])
    more = f" and {len(found) - 8} more" if len(found) > 8 else ""
    plural = "process was" if len(found) == 1 else "processes were"
    return f"{len(found)} {plural} left running and ended {when} (pid {shown}{more}; {how})"


def record_hunted(store: Store, attempt: Attempt, obs: Observation | None, by_daemon: str | None) -> None:
    """Say on the attempt what had to be ended at its end beyond the worker: what its wrapper
    found left in its tree (exit.json's `leftovers`), what the daemon hunted outside the group."""
    lines: list[str] = []
    record = (obs.exit_record if obs is not None else None) or {}
    leftovers = record.get("leftovers") or []
    if leftovers:
        how = " and ".join(record.get("tracking") or []) or "its process tree"
        found = {int(p["pid"]): str(p["name"]) for p in leftovers}
        lines.append(describe(found, f"held by its {how}", "by its wrapper after the worker exited"))
    if by_daemon:
        lines.append(by_daemon)
    if not lines:
        return
    text = "; ".join(lines)[:1000]
    with store.write():
        update_attempt(store, attempt.id, hunted=text)
        add_event(store, "hunted", f"attempt {attempt.n}: {text}", job_id=attempt.job_id, attempt_id=attempt.id)
