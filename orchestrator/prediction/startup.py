"""Start-up and remaining time of attempts, for start-up overlap. Pure.

A job's start-up is the time from its launch to its first training step (imports, model load,
tokenising), learned per suite and config from the attempts that reached a first step (the
shortest seen: orchestrator.store.startups says why), with the GPU memory it held until
HOLD_LEAD_S before that step: a trainer that reports its first step only after it (TRL's first
progress line) has that step's activations in the readings just before, so those are left out,
and a job starts at most its start-up less HOLD_LEAD_S ahead. A running attempt's remaining time
comes from its progress: the steps still to go at the pace of the steps it has run since its
start-up.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.store.startups import Startup

__all__ = ["HOLD_LEAD_S", "HeldReadings", "Startup", "ahead_s", "expected_end_s", "first_step_seen", "remaining_s",
           "startup_key"]

# The readings this long before a first step is seen are not its start-up's: the step itself
# (a first step that builds the optimizer and finds kernels takes seconds) and the pass that
# sees its progress line come in it. A job starts at most its start-up less this ahead, so what
# it holds until then is what was learned.
HOLD_LEAD_S = 5.0
# A running attempt's end by its progress is taken later than its pace says, since a job started
# ahead meets it at its first step: its pace moves (a neighbour's start-up shares the card and
# host), and after its last step it still holds its memory while it saves and exits (2.6-4.5 s
# for TRL on an H200, where a job started on the bare pace met its neighbour 0.5 s before it
# exited and ran out of memory).
END_MARGIN_SHARE = 0.25
EXIT_S = 5.0
MAX_HELD_READINGS = 4096  # a start-up's rises in memory kept; past them the last holds the rest


def startup_key(suite: str, config_name: str) -> str:
    """What a start-up is learned under: the same script and config load the same things."""
    return f"{suite}/{config_name}"


def first_step_seen(step_before: object, step_now: object) -> bool:
    """Whether a pass saw an attempt's first training step (step 0 is still its start-up)."""
    before = step_before if isinstance(step_before, int) and not isinstance(step_before, bool) else 0
    return isinstance(step_now, int) and not isinstance(step_now, bool) and step_now >= 1 > before


def remaining_s(
    now_s: float, started_at_s: float, startup_s: float | None, step: object, total: object,
    first_step: tuple[int, float] | None = None,
) -> float | None:
    """Seconds an attempt has left by its progress: (total - step) steps at the pace of the steps
    it ran since its own first step seen (`first_step`: that step and the seconds since it was
    seen), or where that is not known since its kind's learned start-up; None without a step and
    a total, before a learned start-up ended, or before a step after its first."""
    if not (isinstance(step, int) and isinstance(total, int)) or isinstance(step, bool) or step < 1 or total < step:
        return None
    if first_step is not None:
        # the first step seen was done when it was seen: the pace is that of the steps since
        first, since_s = first_step
        if step <= first or since_s <= 0:
            return None
        return (total - step) * since_s / (step - first)
    training_s = now_s - started_at_s - (startup_s or 0.0)
    if training_s <= 0:
        return None
    return (total - step) * training_s / step


def expected_end_s(now_s: float, remaining: float) -> float:
    """When an attempt with `remaining` seconds of steps to go (`remaining_s`) is taken to have
    ended and freed its memory."""
    return now_s + remaining * (1.0 + END_MARGIN_SHARE) + EXIT_S


def ahead_s(startup: Startup | None) -> float | None:
    """How far ahead of the memory it needs a job may start: its start-up less HOLD_LEAD_S (the
    time its learned hold covers); None when there is no such time."""
    if startup is None or startup.seconds <= HOLD_LEAD_S:
        return None
    return startup.seconds - HOLD_LEAD_S


class HeldReadings:
    """What each starting attempt held on its GPU, reading by reading, until its first step:
    kept as the running maximum at each rise, so a long start-up costs only its rises."""

    def __init__(self) -> None:
        self._rises: dict[int, list[tuple[float, int]]] = {}  # attempt -> (time, most held so far)

    def note(self, attempt_id: int, at_s: float, held_mib: int) -> None:
        rises = self._rises.setdefault(attempt_id, [])
        if not rises or held_mib > rises[-1][1]:
            if len(rises) >= MAX_HELD_READINGS:
                rises[-1] = (rises[-1][0], held_mib)  # later rises fold into the last: never lower
            else:
                rises.append((at_s, held_mib))

    def held_until(self, attempt_id: int, until_s: float) -> int | None:
        """The most the attempt held in its readings at or before `until_s`; None without one."""
        held = None
        for at_s, most in self._rises.get(attempt_id, []):
            if at_s > until_s:
                break
            held = most
        return held

    def keep_only(self, attempt_ids: Iterable[int]) -> None:
        keep = set(attempt_ids)
        self._rises = {k: v for k, v in self._rises.items() if k in keep}
