"""`Sweep`: orch from Python (a notebook), on the same implementation as the CLI.

    from orchestrator.api import Sweep
    s = Sweep("state.db")
    s.submit("E1", pairs=["87:glue-tvt_qnli"], grid={"learning_rate": [1e-4, 3e-4]})
    s.wait()            # until the submitted jobs end, with a progress bar
    s.summary()         # `orch results --json`: a row per setting × task, accounted
    s.results()         # the same table per run: state, counted, marks, typed override columns
    s.curves()          # a row per reported point: job, attempt, step, key, value, the job's names
    s.cancel([3]); s.retry([3]); s.status(); s.start_daemon(); s.stop_daemon()

Steering goes through the same actions as `orch cancel`, `orch retry` and the web page, and
every argument is checked as the CLI checks its options (orchestrator.api.arguments). Every
reader returns a pandas DataFrame (the `notebook` extra), or with `as_frame=False` plain rows
(a list of dicts, in the same columns), so nothing here needs pandas.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.actions.presence import daemon_alive
from orchestrator.actions.suite_changes import retry_jobs
from orchestrator.actions.user_actions import Done, cancel_job
from orchestrator.api import arguments
from orchestrator.api.curves import COLUMNS as CURVE_COLUMNS
from orchestrator.api.curves import curve_points, point_row
from orchestrator.api.daemon_process import start_daemon, stop_daemon
from orchestrator.api.frames import (
    column_order,
    override_columns,
    pruned_step,
    result_rows,
    summary_rows,
    typed_frame,
    with_overrides,
)
from orchestrator.api.jobs import headline_metric
from orchestrator.api.status_snapshot import status_snapshot
from orchestrator.daemon.options import DaemonOptions
from orchestrator.errors import OrchError, UsageError
from orchestrator.lifecycle import TERMINAL_STATES, JobState
from orchestrator.plans import default_plans_dir
from orchestrator.results.filters import parse_where
from orchestrator.results.formats import to_records
from orchestrator.results.selection import Basis, chosen_by, is_chosen
from orchestrator.results.table import ResultsTable, build_table
from orchestrator.store.db import Store
from orchestrator.store.job_facts import job_facts, job_states
from orchestrator.store.queries import get_job, list_jobs, suite_names
from orchestrator.submit.core import SubmitRequest, submit_sweep

JOB_COLUMNS = ("job", "suite", "config", "setting", "seed", "task", "state", "attempt", "level", "gpu", "run_s",
               "metric", "value", "value_attempt", "reason", "submitted_at", "started_at", "ended_at")
TIME_COLUMNS = ("submitted_at", "started_at", "ended_at")
# a curve's point, then its job's names (the override columns go after `config`)
CURVE_FRAME_COLUMNS = (*CURVE_COLUMNS, "suite", "config", "seed", "task", "pruned_step")
_CANCEL_WORDS = {Done.CANCELLED: "cancelled", Done.STOPPING: "stopping", Done.FINISHED: "finished"}


def _pandas() -> bool:
    """True when pandas imports; OrchError (one line) when it does not."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        raise OrchError(
            "DataFrames need pandas: pip install 'orch[notebook]' (or pass as_frame=False for rows)"
        ) from None
    return True


def _frame(rows: list[dict[str, Any]], columns: Sequence[str], as_frame: bool) -> Any:
    if not arguments.flag("as_frame", as_frame):
        return rows
    _pandas()
    return typed_frame(rows, columns)


def setting_text(overrides: Mapping[str, Any]) -> str:
    """A job's overrides in one short line, `learning_rate=0.0003 lora_r=8` ('' for none)."""
    return " ".join(f"{key}={json.dumps(value)}" if not isinstance(value, (int, float)) or isinstance(value, bool)
                    else f"{key}={value!r}" for key, value in sorted(overrides.items()))


class Sweep:
    """One state database (and optionally a plans folder) seen from Python."""

    def __init__(self, db: str | Path = "state.db", plans: str | Path | None = None) -> None:
        self.db_path = arguments.path("db", db)
        self.plans_dir = None if plans is None else arguments.path("plans", plans)
        self.submitted: list[int] = []  # job ids of this object's submits, for wait()

    def _store(self) -> Store:
        return Store(self.db_path, create=False)

    # -------------------------------------------------------------------------------- reading

    def jobs(self, suite: str | None = None, *, as_frame: bool = True) -> Any:
        """A row per job: job (its id), suite, config, one column per override key (typed),
        setting (the overrides as text), seed, task, state, attempt, level, gpu (an integer:
        its live attempt's, or its last one's), run_s, the headline metric and its value, the
        attempt that reported it (value_attempt: an earlier one while a retry reports nothing yet),
        reason, and submitted_at, started_at, ended_at (epoch seconds; UTC datetimes in a
        DataFrame)."""
        suite = arguments.text("suite", suite, optional=True)
        arguments.flag("as_frame", as_frame)
        with self._store() as store:
            listed = list_jobs(store, suite=suite)
            facts = job_facts(store, [j.id for j in listed], store.now_s())
        columns = override_columns((facts[j.id].overrides for j in listed), JOB_COLUMNS)
        rows = []
        for job in listed:
            fact = facts[job.id]
            headline = headline_metric(fact.last_values, job.data)
            row = {"job": job.id, "suite": job.suite, "config": job.config_name,
                   "setting": setting_text(fact.overrides), "seed": job.seed, "task": job.data,
                   "state": job.state.value, "attempt": job.attempt_count, "level": job.level, "gpu": job.gpu,
                   "run_s": fact.run_s, "metric": headline[0] if headline else None,
                   "value": headline[1] if headline else None,
                   "value_attempt": fact.attempt if headline else None, "reason": job.reason,
                   "submitted_at": fact.submitted_at, "started_at": fact.started_at, "ended_at": fact.ended_at}
            rows.append(with_overrides(row, fact.overrides, columns))
        frame = _frame(rows, column_order(JOB_COLUMNS, columns), as_frame)
        if as_frame:
            import pandas as pd

            for name in TIME_COLUMNS:
                frame[name] = pd.to_datetime(frame[name], unit="s", utc=True)
        return frame

    def _table(self, suite: str | None, metric: str | None, pooled: bool, where: Sequence[str],
               digits: int = 4, select: str | None = None) -> ResultsTable:
        if isinstance(digits, bool) or not isinstance(digits, int) or not 0 <= digits <= 10:
            raise UsageError(f"digits must be a whole number from 0 to 10, not {digits!r}")
        if select is not None and select != Basis.VAL.value:
            raise UsageError(f"select must be 'val' (as --select val) or None, not {select!r}")
        with self._store() as store:
            if suite is not None and suite not in suite_names(store):
                raise UsageError(f"unknown suite {suite!r} in {self.db_path}")
            return build_table(store, suite, metric=metric, pooled=pooled, where=parse_where(where),
                               digits=digits, select=Basis(select) if select else None)

    def results(self, suite: str | None = None, *, metric: str | None = None, pooled: bool = False,
                where: Sequence[str] = (), as_frame: bool = True) -> Any:
        """The accounted table per run, as `orch results` counts it: a row per setting × task ×
        seed run × split × metric, with the run's `state` (succeeded, failed, cancelled, running,
        queued, pruned), `counted` (the one run per seed its row uses: the mean of a row's
        counted test values is `orch results`' mean), its `marks` and `why`, `level`,
        `inexact_rungs`, and one typed column per override key. A failed, cancelled or
        unfinished seed is a row without a value. `metric`, `pooled` and `where` as the CLI's
        `--metric`, `--pooled`, `--where`."""
        suite = arguments.text("suite", suite, optional=True)
        metric = arguments.text("metric", metric, optional=True)
        pooled = arguments.flag("pooled", pooled)
        where = arguments.names("where", where) or []
        arguments.flag("as_frame", as_frame)
        rows, columns = result_rows(self._table(suite, metric, pooled, where).lines())
        return typed_frame(rows, columns) if as_frame and _pandas() else rows

    def summary(self, suite: str | None = None, *, metric: str | None = None, pooled: bool = False,
                where: Sequence[str] = (), select: str | None = None, digits: int = 4,
                as_frame: bool = True) -> Any:
        """`orch results --json`: a row per setting × task × metric with n, the accounted text,
        the test and val mean ± std, marks and notes (every key of the CLI's records), plus
        `setting` and a typed column per override key."""
        suite = arguments.text("suite", suite, optional=True)
        metric = arguments.text("metric", metric, optional=True)
        pooled = arguments.flag("pooled", pooled)
        where = arguments.names("where", where) or []
        select = arguments.text("select", select, optional=True)
        arguments.flag("as_frame", as_frame)
        table = self._table(suite, metric, pooled, where, digits, select)
        summaries = table.summaries
        if select is not None:
            summaries = [s for s in summaries if is_chosen(s, table.choices)]
        rows, columns = summary_rows(to_records(summaries, chosen_by(table.choices)))
        return typed_frame(rows, columns) if as_frame and _pandas() else rows

    def curves(self, jobs: Iterable[int] | None = None, suite: str | None = None, keys: Iterable[str] | None = None,
               *, stitched: bool = False, as_frame: bool = True) -> Any:
        """A row per reported point: job, attempt, step, key, value, and the job's suite, config,
        seed, task and one typed column per override key, so a plot needs no merge (`stitched`:
        one curve per job, a later attempt winning from its first step)."""
        wanted_jobs = arguments.job_ids("jobs", jobs)
        suite = arguments.text("suite", suite, optional=True)
        wanted_keys = arguments.names("keys", keys)
        arguments.flag("as_frame", as_frame)
        with self._store() as store:
            points = curve_points(store, jobs=wanted_jobs, suite=suite, keys=wanted_keys,
                                  stitched=arguments.flag("stitched", stitched))
            ids = sorted({p.job for p in points})
            wanted = set(ids)
            listed = {j.id: j for j in list_jobs(store, suite=suite) if j.id in wanted}
            facts = job_facts(store, ids, store.now_s())
            # where early stopping stopped each pruned job: its prune record, on the job row
            stopped = {j.id: pruned_step(get_job(store, j.id)) for j in listed.values() if j.state is JobState.PRUNED}
        columns = override_columns((f.overrides for f in facts.values()), CURVE_FRAME_COLUMNS)
        described = {}
        for job_id in ids:
            job = listed.get(job_id)
            about = {"suite": job.suite, "config": job.config_name, "seed": job.seed, "task": job.data,
                     "pruned_step": stopped.get(job_id)} if job else {}
            described[job_id] = with_overrides(about, facts[job_id].overrides, columns)
        rows = [{**point_row(p), **described[p.job]} for p in points]
        return _frame(rows, column_order(CURVE_FRAME_COLUMNS, columns), as_frame)

    # -------------------------------------------------------------------------------- acting

    def submit(self, suite: str, pairs: Sequence[str] | str | None = None,
               sets: Mapping[str, Any] | None = None, grid: Mapping[str, Sequence[Any]] | None = None,
               *, seeds: Sequence[int] | str | None = None, force: bool = False,
               dry_run: bool = False, priority: int = 0, as_frame: bool = True) -> Any:
        """Queue suite × grid × pairs as `orch submit` does (idempotent unless `force`); a row
        per job: job, config, seed, task, setting, created (new, not found in the database),
        state (`would be queued` in a dry run, where `job` is missing for a new job). wait()
        waits for these.
        `sets` and `grid` are values, typed by the configs as `--set`/`--grid` are; a grid
        value is one value whatever it holds. `seeds` (e.g. [1, 2, 3]) in place of `pairs`:
        those seeds × the suite's tasks, or alone for a script without tasks."""
        request = SubmitRequest(
            arguments.text("suite", suite) or "", arguments.pairs_text(pairs), priority=priority,
            dry_run=arguments.flag("dry_run", dry_run), force=arguments.flag("force", force),
            seeds=arguments.seeds_text(seeds), set_values=sets, grid_values=grid)
        arguments.flag("as_frame", as_frame)
        report = submit_sweep(request, self.db_path, self.plans_dir)
        rows = [{"job": o.job_id, "config": o.spec.config_name, "seed": o.spec.seed, "task": o.spec.data,
                 "setting": setting_text(o.spec.overrides), "created": o.created,
                 "state": o.state_said(request.dry_run)} for o in report.outcomes]
        if not dry_run:
            self.submitted += [
                o.job_id
                for o in report.outcomes
                if o.job_id is not None and o.job_id not in self.submitted
            ]
        return _frame(rows, ("job", "config", "seed", "task", "setting", "created", "state"), as_frame)

    def cancel(self, jobs: Iterable[int]) -> dict[str, list[int]]:
        """Cancel queued jobs and stop running ones, as `orch cancel` does: which were cancelled,
        which are stopping, which had already finished, which were ended before (skipped)."""
        wanted = arguments.job_ids("jobs", jobs, optional=False) or []
        done: dict[str, list[int]] = {word: [] for word in (*_CANCEL_WORDS.values(), "skipped")}
        with self._store() as store:
            for job_id in wanted:
                get_job(store, job_id)  # every id is checked before any is cancelled
            for job_id in wanted:
                done[_CANCEL_WORDS.get(cancel_job(store, job_id), "skipped")].append(job_id)
        return done

    def retry(self, jobs: Iterable[int], *, fresh: bool = False) -> dict[str, list[Any]]:
        """Requeue failed or cancelled jobs (restart running ones), as `orch retry` does: each
        takes its suite file as it is now. `fresh`: resume from none of their checkpoints."""
        wanted = arguments.job_ids("jobs", jobs, optional=False) or []
        with self._store() as store:
            done = retry_jobs(store, wanted, self.plans_dir or default_plans_dir(),
                              fresh=arguments.flag("fresh", fresh))
        self.submitted += [j for j in done.requeued if j not in self.submitted]
        return {"requeued": done.requeued, "restarting": done.restarting, "notes": done.notes}

    def status(self) -> dict[str, Any]:
        """What `orch status --json` says, without its job list: the daemon, GPUs, counts by
        state, running and waiting jobs, paused suites, recent retries and events."""
        with self._store() as store:
            return status_snapshot(store, all_jobs=False)

    def start_daemon(self, *, backend: str | None = None, poll_s: float = 1.0) -> int:
        """Start a daemon on this database in the background, as `orch daemon start` does (its
        log beside the database); its pid. Refused when one runs already."""
        backend = arguments.text("backend", backend, optional=True)
        poll_s = arguments.number("poll_s", poll_s, positive=True) or 1.0
        return start_daemon(DaemonOptions(db_path=self.db_path, backend=backend, poll_s=poll_s))

    def stop_daemon(self, *, drain: bool = False, timeout_s: float = 30.0) -> str:
        """Stop this database's daemon, as `orch daemon stop` does (`drain`: once its running
        jobs end); running workers keep running. What happened, in words."""
        timeout_s = arguments.number("timeout_s", timeout_s, positive=True) or 30.0
        return stop_daemon(self.db_path, drain=arguments.flag("drain", drain), timeout_s=timeout_s)

    def wait(self, jobs: Iterable[int] | None = None, *, timeout_s: float | None = None, poll_s: float = 1.0,
             progress: bool = True, on_poll: Callable[[dict[int, str]], None] | None = None) -> dict[int, str]:
        """Until the jobs (default: those this object submitted, found there already or queued) have
        ended; returns their states. A bar shows how many ended. Jobs that have all ended are
        returned at once; refused at once when some have not and no daemon runs on the database,
        and when there is nothing to wait for (this object submitted nothing and no `jobs` given)."""
        wanted = arguments.job_ids("jobs", jobs)
        wanted = list(self.submitted) if wanted is None else wanted
        timeout_s = arguments.number("timeout_s", timeout_s, optional=True, positive=True)
        poll_s = arguments.number("poll_s", poll_s, positive=True) or 1.0
        progress = bool(arguments.flag("progress", progress))
        on_poll = arguments.callback("on_poll", on_poll)
        if not wanted:
            raise UsageError("nothing to wait for: this Sweep submitted no job (a new one after a restart of the "
                             "kernel knows none): submit again, which finds the jobs already there, or pass jobs=[...]")
        states = self._states(wanted)
        if all(JobState(s) in TERMINAL_STATES for s in states.values()):
            return states  # ended already: no daemon needed
        with self._store() as store:
            if daemon_alive(store) is None:
                raise OrchError(f"no daemon runs on {self.db_path}: start one (`orch daemon start`) and wait again")
        deadline_s = None if timeout_s is None else time.monotonic() + timeout_s
        bar = _Bar(len(wanted)) if progress else None
        try:
            while True:
                states = self._states(wanted)
                ended = sum(JobState(s) in TERMINAL_STATES for s in states.values())
                if bar is not None:
                    bar.show(ended, states)
                if on_poll is not None:
                    on_poll(states)
                if ended == len(wanted):
                    return states
                if deadline_s is not None and time.monotonic() > deadline_s:
                    raise TimeoutError(f"{len(wanted) - ended} of {len(wanted)} jobs still running after {timeout_s} s")
                time.sleep(poll_s)  # the daemon moves them; nothing to be woken by here
        finally:
            if bar is not None:
                bar.close()

    def _states(self, job_ids: Sequence[int]) -> dict[int, str]:
        with self._store() as store:
            found = job_states(store, job_ids)
        missing = [j for j in job_ids if j not in found]
        if missing:
            raise UsageError(f"no job {missing[0]} in {self.db_path}")
        return found


class _Bar:
    """A progress bar of ended jobs (rich, which renders in a terminal and in a notebook)."""

    def __init__(self, total: int) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
        )
        self.task = self.progress.add_task("jobs ended", total=total)
        self.progress.start()

    def show(self, ended: int, states: Mapping[int, str]) -> None:
        counts: dict[str, int] = {}
        for state in states.values():
            counts[state] = counts.get(state, 0) + 1
        words = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        self.progress.update(self.task, completed=ended, description=f"jobs ended ({words})")

    def close(self) -> None:
        self.progress.stop()

