"""How long each live attempt has shown no sign of life, measured by the daemon itself on its
monotonic clock: the time since a pass last saw something change (a progress line, stdout.log
growing, pid.json appearing). File times are only compared with each other, never with the
wall clock, so a clock step (NTP, `date -s`, a VM resume) neither kills healthy workers as hung
nor switches hang detection off. An attempt first seen by this daemon starts its count then."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from orchestrator.executors.observation import Observation

Sign = tuple[bool, float | None, float | None]


def sign_of_life(obs: Observation) -> Sign:
    """What changes when the attempt shows life: its files' presence and modification times
    (compared only with their own earlier values)."""
    return obs.pid_file_present, obs.last_progress_at, obs.last_output_at


class Silences:
    def __init__(self, monotonic_s: Callable[[], float]) -> None:
        self._monotonic_s = monotonic_s
        self._seen: dict[int, tuple[Sign, float]] = {}  # attempt id -> (last sign, when it changed)
        self._first_seen: dict[int, float] = {}  # attempt id -> when this daemon first looked at it

    def silent_s(self, attempt_id: int, obs: Observation) -> float:
        """Seconds since this attempt's sign of life last changed (0 when it just did)."""
        now_s = self._monotonic_s()
        self._first_seen.setdefault(attempt_id, now_s)
        sign = sign_of_life(obs)
        seen = self._seen.get(attempt_id)
        if seen is None or seen[0] != sign:
            self._seen[attempt_id] = (sign, now_s)
            return 0.0
        return max(0.0, now_s - seen[1])

    def watched_s(self, attempt_id: int) -> float:
        """Seconds since this daemon first looked at the attempt (0 before it did): for one it
        claimed itself, the pass after the claim; never more than the attempt's real age."""
        first_s = self._first_seen.get(attempt_id)
        return 0.0 if first_s is None else max(0.0, self._monotonic_s() - first_s)

    def keep_only(self, attempt_ids: Iterable[int]) -> None:
        keep = set(attempt_ids)
        self._seen = {k: v for k, v in self._seen.items() if k in keep}
        self._first_seen = {k: v for k, v in self._first_seen.items() if k in keep}
