"""Stopping an attempt's process group across daemon passes, never waiting inside one.

A pass that must stop a group signals it (SIGTERM), notes when, and goes on scheduling; later
passes look at the group again (one read of the process table per pass, shared by every stop
under way), send SIGKILL once the grace is over, and report the group gone only when no member
of it is left. The caller ends the attempt only then: never requeue while any of the group
lives, or two live attempts of one job would exist.

`next_step` is the pure core: given what was sent when and whether the group lives now, what
to do. `GroupStopper` applies it: it holds the state, reads the table, sends the signals.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from orchestrator.attempts.reconcile import group_is_ours
from orchestrator.clock import Clock
from orchestrator.errors import LauncherError
from orchestrator.executors.process_groups import ProcessGroups, signal_group
from orchestrator.gpu.snapshot import GpuSnapshot

log = logging.getLogger(__name__)

KILL_GRACE_S = 5.0  # SIGTERM, then this long, then SIGKILL
KILL_RESEND_S = 1.0  # while members outlive SIGKILL (forked meanwhile), it is sent again this often
STUCK_S = 30.0  # members alive this long after SIGKILL (uninterruptible sleep): said once in the log


class KillStep(str, Enum):
    TERM = "term"  # send SIGTERM now
    KILL = "kill"  # send SIGKILL now: the grace is over, or members outlived the last one
    WAIT = "wait"  # signalled; give it time
    GONE = "gone"  # no member lives: the attempt may end


@dataclass(frozen=True)
class KillState:
    """What was sent to one group, and when (monotonic seconds)."""

    term_at_s: float | None = None
    kill_at_s: float | None = None  # the first SIGKILL
    last_kill_at_s: float | None = None  # the latest, resent while members outlive it
    stuck_said: bool = False


def next_step(state: KillState, alive: bool, now_s: float, grace_s: float = KILL_GRACE_S,
              resend_s: float = KILL_RESEND_S) -> KillStep:
    """Pure: the next thing to do to a group in `state` that is (or is not) `alive` at `now_s`."""
    if not alive:
        return KillStep.GONE
    if state.term_at_s is None:
        return KillStep.TERM
    if state.kill_at_s is None:
        return KillStep.KILL if now_s - state.term_at_s >= grace_s else KillStep.WAIT
    last = state.last_kill_at_s if state.last_kill_at_s is not None else state.kill_at_s
    return KillStep.KILL if now_s - last >= resend_s else KillStep.WAIT


def after(state: KillState, step: KillStep, now_s: float) -> KillState:
    """Pure: the state once `step` was carried out at `now_s`."""
    if step is KillStep.TERM:
        return replace(state, term_at_s=now_s)
    if step is KillStep.KILL:
        first = state.kill_at_s if state.kill_at_s is not None else now_s
        return replace(state, kill_at_s=first, last_kill_at_s=now_s,
                       term_at_s=state.term_at_s if state.term_at_s is not None else now_s)
    return state


def is_stuck(state: KillState, alive: bool, now_s: float, stuck_s: float = STUCK_S) -> bool:
    """Pure: members still alive `stuck_s` after SIGKILL (a process in uninterruptible sleep)."""
    return alive and state.kill_at_s is not None and now_s - state.kill_at_s >= stuck_s


SIGNALS = {KillStep.TERM: signal.SIGTERM, KillStep.KILL: signal.SIGKILL}


class GroupStopper:
    """The stops under way, keyed by attempt id. Call `new_pass` once per daemon pass, then
    `stop` for each group to stop; `stop` never waits."""

    def __init__(self, clock: Clock, grace_s: float = KILL_GRACE_S,
                 send: Callable[[int, int], bool] = signal_group,
                 read_groups: Callable[[], ProcessGroups] = ProcessGroups) -> None:
        self.clock = clock
        self.grace_s = grace_s
        self._send = send
        self._read_groups = read_groups
        self._groups = read_groups()
        self._states: dict[int, KillState] = {}

    def new_pass(self) -> None:
        """The process table changes between passes: read it again at the next question."""
        self._groups = self._read_groups()

    def pending(self) -> dict[int, KillState]:
        return dict(self._states)

    def stop(self, key: int, pgid: int, leader_create_time: float | None) -> bool:
        """Advance the stop of this group by one step; True once nothing of it lives (or the
        pgid is no longer the attempt's: its leader is another process now)."""
        alive = group_is_ours(pgid, leader_create_time, self._groups)
        now = self.clock.monotonic_s()
        state = self._states.get(key, KillState())
        step = next_step(state, alive, now, self.grace_s)
        if step is KillStep.GONE:
            self._states.pop(key, None)
            return True
        if step in SIGNALS:
            try:
                if not self._send(pgid, SIGNALS[step]):
                    self._states.pop(key, None)  # no process of the group was left to signal
                    return True
            except LauncherError as exc:  # not ours to signal: tried again next pass, said each time
                log.warning("attempt %s: %s", key, exc)
                return False
            if step is KillStep.KILL and state.kill_at_s is None:
                log.warning(
                    "attempt %s: process group %s outlived SIGTERM by %.0f s; sent SIGKILL",
                    key,
                    pgid,
                    self.grace_s,
                )
            state = after(state, step, now)
        if is_stuck(state, alive, now) and not state.stuck_said:
            log.warning("attempt %s: process group %s still alive %.0f s after SIGKILL (uninterruptible?); "
                        "its attempt stays open until it is gone", key, pgid, now - (state.kill_at_s or now))
            state = replace(state, stuck_said=True)
        self._states[key] = state
        return False

    def keep_only(self, keys: Iterable[int]) -> None:
        """Forget stops of attempts closed meanwhile."""
        wanted = set(keys)
        self._states = {k: v for k, v in self._states.items() if k in wanted}


def ending_peaks_mib(
    gpu_uuid: str, peak_mib: int, predicted_peak_mib: int, peak_by_gpu: Mapping[str, Any]
) -> dict[str, int]:
    """Pure: card uuid -> MiB to count as held for an attempt that ended while members of its
    group live on (its wrapper exiting, a straggler being stopped): its peak on each card, as
    when the pass waited for the group, so nothing is packed into memory it may still hold."""
    peaks: dict[str, int] = {}
    for uuid, mib in peak_by_gpu.items():
        if isinstance(mib, int) and not isinstance(mib, bool):
            peaks[str(uuid)] = mib
    if not peaks and gpu_uuid:
        peaks = {gpu_uuid: peak_mib or predicted_peak_mib}
    return peaks


def with_memory_held(snapshots: tuple[GpuSnapshot, ...], held_mib: Mapping[str, int]) -> tuple[GpuSnapshot, ...]:
    """Pure: the readings with `held_mib` (per card uuid) taken off each card's free memory."""
    if not any(held_mib.values()):
        return snapshots
    return tuple(replace(s, free_mib=max(0, s.free_mib - held_mib.get(s.uuid, 0))) for s in snapshots)
