"""Pure: how long ago an attempt's launch was asked, as far as the daemon can vouch for it, for
the launch grace of a cluster attempt whose submission went unanswered.

Wall time is not a measure of it: a clock step (NTP, `date -s`, a VM resume) would declare a
launch still on its way lost (and its job could then run twice) or keep a lost one waiting for
hours. So the daemon measures on its monotonic clock how long it has watched the attempt; it
first sees an attempt it claimed itself on the pass after the claim, so that is never more than
the attempt's real age. An attempt adopted after a restart was claimed before this daemon
started: the time between its claim and this daemon's start is known only from the two wall
times recorded then. A step since this daemon started moves neither of them; a negative gap (the
clock went back while no daemon ran) or an absurd one is not trusted, counts as nothing, and is
said: the daemon's own measure alone then decides, one grace later than needed at most.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.wording import fmt_duration

# The longest gap between a claim and the next daemon's start taken as told. Longer reads as a
# clock step forward while no daemon ran as much as a long stop; either way the daemon waits
# for its own measure (at most one launch grace) rather than risk a second run of the job.
MAX_TRUSTED_GAP_S = 24 * 3600.0


@dataclass(frozen=True)
class LaunchAge:
    age_s: float  # never more than the real time since the launch was asked (monotonic)
    adopted: bool  # claimed by an earlier daemon (this one was not running then)
    distrusted: str | None = None  # why the recorded wall times were not taken, in words

    def said(self) -> str:
        """For an attempt's reason: how the age was measured."""
        measured = "watched by this daemon" if not self.adopted else "since its claim (adopted after a daemon restart)"
        note = f"; {self.distrusted}" if self.distrusted else ""
        return f"{fmt_duration(self.age_s)} {measured}{note}"


def launch_age(watched_s: float, adopted: bool, claimed_at_s: float, daemon_started_at_s: float | None) -> LaunchAge:
    """`watched_s`: how long this daemon has watched the attempt (monotonic); `adopted`: it was
    claimed before this daemon started; `claimed_at_s` and `daemon_started_at_s`: the wall
    times recorded at the claim and at this daemon's start."""
    watched_s = max(0.0, watched_s)
    if not adopted:
        return LaunchAge(watched_s, adopted=False)
    if daemon_started_at_s is None:
        return LaunchAge(watched_s, adopted=True, distrusted="this daemon's start time is not known")
    gap_s = daemon_started_at_s - claimed_at_s
    if gap_s < 0:
        return LaunchAge(watched_s, adopted=True, distrusted=(
            f"its claim is recorded {fmt_duration(-gap_s)} after this daemon started (the wall clock went back): "
            "only this daemon's own measure counts"))
    if gap_s > MAX_TRUSTED_GAP_S:
        return LaunchAge(watched_s, adopted=True, distrusted=(
            f"its claim is recorded {fmt_duration(gap_s)} before this daemon started, more than the "
            f"{fmt_duration(MAX_TRUSTED_GAP_S)} trusted (a wall-clock step?): only this daemon's own measure counts"))
    return LaunchAge(watched_s + gap_s, adopted=True)
