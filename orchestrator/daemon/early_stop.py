"""The daemon's early-stopping step: for each suite and task with an `early_stop:` rule and a
job running, read its settings' metric histories and what the pruner was told before, ask the
pure core (`orchestrator.scheduling.early_stop`) which settings to stop, and write that: the
rung values told, each pruned setting's jobs stopped (as a cancel stops them, ending `pruned`),
and a warning event when the metric is missing. A failure here never holds up the pass."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.lifecycle import JobState
from orchestrator.plans.early_stop import EarlyStop, describe_pruned
from orchestrator.scheduling.early_stop import Judgement, SeedRun, SettingRuns, Spared, judge
from orchestrator.store.db import Store
from orchestrator.store.early_stop import (
    early_stop_jobs,
    metric_last_steps,
    metric_points_at,
    prune_jobs,
    reached_steps,
    read_rungs,
    record_rungs,
    reported_keys,
    warn_early_stop,
    where,
)
from orchestrator.store.rows import Job

log = logging.getLogger(__name__)

CHECK_EVERY_S = 2.0  # histories are read every few seconds at most (attempts.observe_cache)


def setting_key(job: Job) -> str:
    """A setting: the config and its overrides (the seed and task apart)."""
    return f"{job.config_name} {json.dumps(job.overrides, sort_keys=True)}"


def group_settings(
    jobs: Sequence[Job], values: dict[int, dict[float, float]], reached: dict[int, float]
) -> list[SettingRuns]:
    """The settings of one suite and task, in the order of their first job."""
    return [
        SettingRuns(
            key,
            tuple(
                SeedRun(j.id, j.state, values.get(j.id, {}), reached.get(j.id, 0.0))
                for j in members
            ),
            decided=any(j.pruned for j in members),
        )
        for key, members in by_setting(jobs).items()
    ]


def by_setting(jobs: Sequence[Job]) -> dict[str, list[Job]]:
    """Each setting's jobs, in job order; the settings in the order of their first job."""
    grouped: dict[str, list[Job]] = {}
    for job in sorted(jobs, key=lambda j: j.id):
        grouped.setdefault(setting_key(job), []).append(job)
    return grouped


class EarlyStopper:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._next_check_s = 0.0
        self._warned: set[tuple[str, str, str]] = set()  # (suite, task, what): said once per daemon
        self._judged: dict[
            tuple[str, str], tuple[tuple[int, str, int, bool], ...]
        ] = {}  # each group's last look

    def check(self) -> None:
        if time.monotonic() < self._next_check_s:
            return
        self._next_check_s = time.monotonic() + CHECK_EVERY_S
        groups: dict[tuple[str, str], list[Job]] = {}
        for job in early_stop_jobs(self.store):
            groups.setdefault((job.suite, job.data), []).append(job)
        for (suite, data), jobs in groups.items():
            try:
                self._check_group(suite, data, jobs)
            except UsageError as exc:  # Optuna missing: said once, nothing stopped
                self._warn_once(suite, data, "optuna", f"early stopping is off: {exc}")
            except Exception:
                log.exception("early stopping of %s on %s failed; nothing stopped", suite, data)

    def _check_group(self, suite: str, data: str, jobs: list[Job]) -> None:
        spec = EarlyStop.from_json(jobs[-1].early_stop)
        if spec is None:
            return
        ids = [job.id for job in jobs]
        last = metric_last_steps(self.store, ids, spec.metric)
        silent = [job_id for job_id in ids if job_id not in last]  # how far they got, by any metric
        reached = {**reached_steps(self.store, silent), **last}
        # nothing new to judge until a job passes a rung or changes state: the histories stay unread
        signature = tuple(
            (j.id, j.state.value, len(spec.rung_steps(reached.get(j.id, 0.0))), j.id in last)
            for j in jobs
        )
        if self._judged.get((suite, data)) == signature:
            return
        self._stop_new_seeds(suite, data, jobs)
        steps = spec.rung_steps(max(last.values(), default=0.0))
        points = metric_points_at(self.store, ids, spec.metric, steps, spec.smooth_evals, spec.best_of())
        settings = group_settings(jobs, points, reached)
        rule = jobs[-1].early_stop  # the newest job's rule: a resubmitted suite's is the one judged by
        judged = judge(spec, settings, read_rungs(self.store, suite, data, rule))
        self._judged[(suite, data)] = signature
        self._write(suite, data, spec, rule, judged, ids)

    def _stop_new_seeds(self, suite: str, data: str, jobs: list[Job]) -> None:
        """A seed queued after its setting was stopped (a new seed submitted) ends pruned too:
        stopping a setting stops all of its seeds. A job retried after its prune (`orch retry`)
        keeps its record, and runs."""
        for key, members in by_setting(jobs).items():
            stopped = [job for job in members if job.pruned]
            new = [job.id for job in members if not job.pruned and job.state in (JobState.QUEUED, JobState.RUNNING)]
            if not stopped or not new:
                continue
            record = max(stopped, key=lambda job: job.id).pruned
            why = f"{describe_pruned(record)}, before this seed was queued"
            stopping, pruned = prune_jobs(self.store, new, record, why)
            log.info("setting %s of %s was stopped: stopping its new seeds %s, pruned %s", key, where(suite, data),
                     stopping, pruned)  # fmt: skip

    def _write(
        self, suite: str, data: str, spec: EarlyStop, rule: dict[str, Any], judged: Judgement, ids: list[int]
    ) -> None:
        record_rungs(self.store, suite, data, rule, judged.told)  # before the stops: a restart tells none twice
        for prune in judged.prunes:
            record = prune.record(spec)
            why = f"{describe_pruned(record)}: setting {prune.setting} of {where(suite, data)}"
            stopping, pruned = prune_jobs(
                self.store, prune.job_ids, record, describe_pruned(record)
            )
            log.info("%s; stopping jobs %s, pruned queued jobs %s", why, stopping, pruned)
        for kept in judged.spared:  # said once a daemon run per setting and rung step
            self._warn_once(suite, data, f"spared {kept.setting} {kept.step}", spared_words(spec, kept))
        if judged.metric_missing_at is not None and (suite, data, "metric") not in self._warned:
            keys = reported_keys(self.store, ids)  # what a misspelt metric was likely meant as
            self._warn_once(
                suite,
                data,
                "metric",
                f"early_stop metric {spec.metric!r} not reported by step "
                f"{judged.metric_missing_at} (the first rung): nothing is stopped on missing data "
                f"({'reported: ' + ', '.join(keys) if keys else 'no metric reported over steps yet'})",
            )

    def _warn_once(self, suite: str, data: str, what: str, message: str) -> None:
        if (suite, data, what) in self._warned:
            return
        self._warned.add((suite, data, what))
        warn_early_stop(self.store, suite, data, message)


def spared_words(spec: EarlyStop, kept: Spared) -> str:
    """What `margin_se` did: the setting asha would have stopped, and why it goes on."""
    value = f"{spec.metric} {kept.value:.4g} (the setting's mean over its seeds)"
    if kept.standard_error is None:
        why = f"as good as the rung's cutoff {kept.cutoff:.4g}"
    else:
        why = (f"{abs(kept.cutoff - kept.value):.4g} from the rung's cutoff {kept.cutoff:.4g}, within "
               f"margin_se {spec.margin_se:g} × its standard error {kept.standard_error:.4g}")  # fmt: skip
    return f"kept at step {kept.step} by margin_se: setting {kept.setting}, {value}, {why}"
