"""The crash-loop guard: a config whose attempts keep failing within seconds for reasons other
than memory is paused (its suite once every config of it is), so a broken script does not burn
through the queue."""

from __future__ import annotations

from orchestrator.plans import CrashLoop
from orchestrator.store.db import Store
from orchestrator.store.endings import (
    pause_config,
    pause_suite,
    recent_failure_durations,
    unpaused_configs,
)
from orchestrator.store.rows import Job
from orchestrator.store.status import paused_configs


def crash_loop_of(job: Job) -> CrashLoop:
    """The suite's crash-loop setting as it was when this job was submitted."""
    return CrashLoop(
        failures=job.crash_loop_failures,
        within_s=job.crash_loop_within_s,
        window_s=job.crash_loop_window_s,
    )


def _seconds(seconds: float) -> str:
    """300 -> '5 min', 90 -> '90 s': the guard's settings as a user wrote them, roughly."""
    if seconds >= 120 and seconds % 60 == 0:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:g} s"


def crash_loop_reason(durations_s: list[float], guard: CrashLoop) -> str | None:
    """Why the suite should pause, given how long each of its recent non-OOM failures ran
    (those that ended inside the guard's window); None while it should not."""
    if not guard.enabled:
        return None
    # a negative length is a wall-clock step back while it ran (its length is unknown), not a crash
    fast = [d for d in durations_s if 0 <= d < guard.within_s]
    if len(fast) < guard.failures:
        return None
    attempts = "attempt" if len(fast) == 1 else "attempts"
    within, window = _seconds(guard.within_s), _seconds(guard.window_s)
    return f"{len(fast)} {attempts} failed within {within} each in the last {window}"


def guard_crash_loop(store: Store, suite: str, config: str, guard: CrashLoop) -> None:
    """Pause a config whose attempts keep failing within seconds for non-OOM reasons; the
    suite's other configs run on, and the suite itself pauses once every config of it is
    paused. The failing job's setting decides, so a suite resubmitted with a changed
    `crash_loop` uses the new one."""
    if not guard.enabled:
        return
    now_s = store.now_s()
    durations = recent_failure_durations(store, suite, config, now_s - guard.window_s, now_s)
    reason = crash_loop_reason(durations, guard)
    if reason is None:
        return
    fix = (
        f"fix it, then `orch retry --suite {suite}` (and `orch resume {suite}`, "
        "unless the fix changed its worker command)"
    )
    still_running = unpaused_configs(store, suite)
    others = [name for name in still_running if name != config]
    if others:
        pause_config(
            store,
            suite,
            config,
            reason,
            f"config {config} of suite {suite} paused: {reason}; its other configs run on; {fix}",
        )
        return
    # the last config of the suite still running: the suite pauses (one pause, one event)
    configs = len(
        {config, *(p.config for p in paused_configs(store, count_queued=False) if p.suite == suite)}
    )
    suite_reason = (
        reason
        if configs == 1
        else f"all {configs} configs paused by the crash-loop guard, the last for {reason}"
    )
    pause_suite(store, suite, suite_reason, f"suite {suite} paused: {suite_reason}; {fix}")
