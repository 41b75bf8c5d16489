"""What a running attempt teaches at its first training step: how long its start-up took and
what it held on the GPU until shortly before then (orchestrator.prediction.startup)."""

from __future__ import annotations

import logging

from orchestrator.executors.observation import Observation
from orchestrator.prediction.startup import HOLD_LEAD_S, HeldReadings, first_step_seen, startup_key
from orchestrator.store.attempts import update_attempt
from orchestrator.store.db import Store
from orchestrator.store.rows import Attempt, Job
from orchestrator.store.startups import record_startup

log = logging.getLogger(__name__)

# How far the start-up read from wall times (the claim, the progress file's time) may differ from
# the daemon's own monotonic measure of the attempt before a clock step is concluded: the pass
# that first looks at an attempt, and the one that reads its first step, each come a few
# seconds late.
STEP_TOLERANCE_S = 30.0


def startup_from(wall_s: float, watched_s: float | None, adopted: bool) -> float | None:
    """Pure: the start-up to learn from `wall_s` (first step's file time minus the claim time),
    or None when a wall-clock step moved it. `watched_s`: how long this daemon has watched the
    attempt on its monotonic clock (None: not known, nothing to check against); `adopted`:
    claimed before this daemon started, so its wall start-up may be longer than the watch. A
    start-up taken too long would start the next job's training while the old one still runs;
    one skipped is only learned from the next attempt."""
    if wall_s < 0:
        return None  # the clock went back while it started
    if watched_s is None:
        return wall_s
    if wall_s + STEP_TOLERANCE_S < watched_s:
        return None  # shorter than this daemon has watched it: the clock went back
    if not adopted and wall_s > watched_s + STEP_TOLERANCE_S:
        return None  # longer than since this daemon claimed it: the clock went forward (or the daemon stalled)
    return wall_s


def startup_hold_mib(attempt: Attempt, seen_at_s: float, readings: HeldReadings | None) -> int | None:
    """What the attempt held until HOLD_LEAD_S before its first step was seen at `seen_at_s`:
    the most of its readings then; None without one (a start-up shorter than the lead, a daemon
    started since, a process on another machine): then its start-up is not learned, since a
    hold taken too small starts a job beside memory it will need."""
    return None if readings is None else readings.held_until(attempt.id, seen_at_s - HOLD_LEAD_S)


def learn_startup(
    store: Store, attempt: Attempt, job: Job, obs: Observation, now_s: float, *,
    watched_s: float | None = None, adopted: bool = False, readings: HeldReadings | None = None,
) -> None:
    """Record the start-up of an attempt whose first step this pass saw (its progress before the
    pass had no step), with what it held (`startup_hold_mib`; `readings`: its GPU readings as
    the daemon took them, on the clock of `now_s`). `watched_s` and `adopted`: as
    `startup_from` takes them."""
    step_now = (obs.last_progress or {}).get("step")
    if not first_step_seen((attempt.progress or {}).get("step"), step_now):
        return
    # when the line was written: progress.jsonl's time, else the output's (stdout-parsed progress)
    written_at = obs.last_progress_at if obs.last_progress_at is not None else obs.last_output_at
    seen_at = float(written_at) if written_at is not None else now_s
    first_step = step_now if isinstance(step_now, int) else 1  # first_step_seen: an int
    try:  # its own pace counts from this step (orchestrator.prediction.startup.remaining_s)
        update_attempt(store, attempt.id, first_step=first_step, first_step_at=seen_at)
    except Exception:
        log.warning("cannot record the first step of attempt %s", attempt.id, exc_info=True)
    wall_s = seen_at - attempt.started_at
    seconds = startup_from(wall_s, watched_s, adopted)
    if seconds is None:
        log.warning("start-up of attempt %s not learned: its files say %.0f s, this daemon watched it %.0f s "
                    "(the wall clock stepped)", attempt.id, wall_s, watched_s or 0.0)
        return
    held_mib = startup_hold_mib(attempt, seen_at, readings)
    if held_mib is None:
        return  # nothing read before its first step (adopted, remote, too short a start-up)
    try:
        record_startup(store, startup_key(job.suite, job.config_name), seconds, held_mib)
    except Exception:  # learning must not stop reconciling the others
        log.warning("cannot record the start-up of attempt %s", attempt.id, exc_info=True)
