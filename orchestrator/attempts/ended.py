"""How an attempt still recorded as live ended, when its worker has already exited: read from
its run dir (the wrapper's exit record, this attempt's own result.json, the log tail) the way
the daemon will read it. A user's cancel or retry asks this first, so a worker that finished
while no daemon watched (stopped, or paused) keeps its result instead of being taken for one
the request stopped."""

from __future__ import annotations

import time
from pathlib import Path

from orchestrator.attempts.classify import Classification
from orchestrator.attempts.next_step import EndEvidence, classify_end, ended_by_itself
from orchestrator.attempts.reconcile import observe, read_log_tail, read_result
from orchestrator.plans.template import OUR_WORKERS
from orchestrator.prediction.fused_groups import fused
from orchestrator.store.rows import Attempt, Job


def end_of_exited(attempt: Attempt, job: Job) -> Classification | None:
    """How the attempt ended, when its worker exited on its own (None: it runs, or it was
    stopped, or its end is not recorded in a way orch can trust)."""
    run_dir = Path(attempt.run_dir)
    obs = observe(run_dir, time.time(), attempt)  # the exit record only if it carries the attempt's token
    if not ended_by_itself(obs.exit_record):
        return None
    result = read_result(run_dir, [])
    if result is not None and attempt.token and job.worker in OUR_WORKERS and result.get("token") != attempt.token:
        result = None  # another attempt's result (our workers sign theirs)
    evidence = EndEvidence(obs.exit_record, result, read_log_tail(run_dir), None, fused=fused(job))
    return classify_end(evidence).classification
