"""A fix to a suite file takes: a retry (`orch retry`, the web page's retry) starts a job with the
suite's worker command as the file says now, and a suite the crash-loop guard paused for the
command it ran is resumed once that command has changed (by a retry or a resubmission).
Anything else is said in one line."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.actions.user_actions import Done, check_retryable, retry_job
from orchestrator.errors import PlanError, SuiteNotFound
from orchestrator.plans import Pair, check_worker_template, expand_jobs, load_suite
from orchestrator.store.control import JobCommand, job_command, set_job_command
from orchestrator.store.db import Store
from orchestrator.store.queries import get_job
from orchestrator.store.rows import Job
from orchestrator.submit.suite_pause import resume_if_changed


def take_suite_as_it_is(store: Store, job_id: int, plans_dir: Path) -> tuple[bool, str | None]:
    """Before a retry: give job `job_id` its suite's worker command, env, output keys and hang
    timeout as the suite file has them now, when the job itself (config content, seed, data,
    overrides) is still the same. Returns (whether its worker command changed, a line for the
    user when the file could not be taken)."""
    job = get_job(store, job_id)
    try:
        suite = load_suite(job.suite, plans_dir)
    except SuiteNotFound:
        return False, None  # submitted from another plans folder: it runs as it was submitted
    except PlanError as exc:
        return False, f"job {job_id} runs as submitted: its suite file does not load now ({exc})"
    overrides = dict(job.overrides)
    specs = [s for s in expand_jobs(suite, [Pair(job.seed, job.data)], overrides, None, 0)
             if s.config_name == job.config_name]
    if not specs or not _same_job(job, specs[0].identity, specs[0].config):
        how = f"--pairs {job.seed}:{job.data}" if job.data else f"--seeds {job.seed}"
        return False, (f"job {job_id} runs as submitted: config {job.config_name} or its overrides changed since "
                f"(`orch submit --suite {job.suite} {how}` queues it as it is now)")
    spec = specs[0]
    try:
        check_worker_template(suite, specs, overrides)
    except PlanError as exc:
        return False, f"job {job_id} runs as submitted: the suite as it is now refuses it ({exc})"
    now = JobCommand(suite.worker, json.dumps(spec.env, sort_keys=True),
                     json.dumps(suite.worker_output, sort_keys=True), suite.hang_timeout_s)
    before = job_command(store, job_id)
    if now != before:
        shown = "worker command" if now.worker != before.worker else "worker settings"
        set_job_command(
            store,
            job_id,
            now,
            f"retry takes the suite's {shown} as {suite.path.name} has it now: {now.worker}",
        )
    return now.worker != before.worker, None


def _same_job(job: Job, identity: str, config: dict[str, object]) -> bool:
    """Whether the suite file as it is now gives `job` what it was submitted with. A search trial the
    daemon queued carries an identity of its own making (orchestrator.store.search): its config as
    stored decides."""
    if identity == job.identity:
        return True
    return bool(job.search) and json.loads(json.dumps(config, sort_keys=True)) == job.config


@dataclass
class Retried:
    requeued: list[int] = field(default_factory=list)
    restarting: list[int] = field(default_factory=list)  # running jobs, stopped to start again
    notes: list[str] = field(default_factory=list)  # lines for the user (a suite file not taken, a pause)


def retry_jobs(store: Store, job_ids: list[int], plans_dir: Path, *, fresh: bool = False) -> Retried:
    """Retry each job: every one is checked first (UsageError, nothing written, if any cannot be
    retried); a failed or cancelled one takes its suite file as it is now (take_suite_as_it_is)
    and is requeued, a running one is restarted; a suite paused for the command that changed is
    resumed. `fresh`: the next attempts resume from no checkpoint."""
    for job_id in job_ids:
        check_retryable(store, job_id)
    done = Retried()
    changed_suites: set[str] = set()
    taken: dict[int, str | None] = {}  # job id -> its note, once its suite file was taken

    def take_suite(job: Job) -> None:
        changed, taken[job.id] = take_suite_as_it_is(store, job.id, plans_dir)
        changed_suites.update([job.suite] if changed else [])

    for job_id in job_ids:
        if retry_job(store, job_id, fresh=fresh, before_requeue=take_suite) is Done.REQUEUED:
            done.requeued.append(job_id)
        else:
            done.restarting.append(job_id)
    done.notes.extend(note for note in taken.values() if note)
    for suite_name in sorted({get_job(store, i).suite for i in done.requeued}):
        note = resume_if_changed(store, suite_name, suite_name in changed_suites)
        done.notes.extend([note] if note else [])
    return done
