"""A suite the crash-loop guard paused for the command it ran is resumed once that command has
changed, by a resubmission (orchestrator.submit.core) or a retry (orchestrator.actions)."""

from __future__ import annotations

from orchestrator.store.control import resume_changed_suite, worker_of_last_failure
from orchestrator.store.db import Store
from orchestrator.store.status import paused_configs, paused_suites


def resume_if_changed(store: Store, suite: str, worker_changed: bool) -> str | None:
    """When `suite` is paused: resume it if its jobs now run another worker command than the
    failures that paused it (`worker_changed`); else return a line saying the jobs wait, and how
    to let them run."""
    reason = next(
        (p.reason for p in paused_suites(store, count_queued=False) if p.suite == suite), None
    )
    reason = reason or next(
        (
            f"config {p.config}: {p.reason}"
            for p in paused_configs(store, count_queued=False)
            if p.suite == suite
        ),
        None,
    )
    if reason is None:
        return None
    if worker_changed:
        resume_changed_suite(
            store, suite, "its worker command changed since the failures that paused it"
        )
        return f"suite {suite} was paused ({reason}); resumed, since its worker command changed"
    return f"suite {suite} is paused ({reason}): its queued jobs wait until `orch resume {suite}`"


def worker_changed_since_failure(store: Store, suite: str, worker: str) -> bool:
    """Whether `worker` differs from the command the suite's last failure ran."""
    failed_with = worker_of_last_failure(store, suite)
    return failed_with is not None and failed_with != worker
