"""`Sweep`: orch from Python (a notebook), on the same implementation as the CLI.

    from orchestrator.api import Sweep
    s = Sweep("state.db")
    s.submit("E1", pairs=["87:glue-tvt_qnli"], grid={"learning_rate": [1e-4, 3e-4]})
    s.wait()            # until the submitted jobs end, with a progress bar
    s.results()         # a row per run and metric
    s.curves()          # a row per reported point: job, attempt, step, key, value

Every reader returns a pandas DataFrame (the `notebook` extra), or with `as_frame=False` plain
rows (a list of dicts, in the same columns), so nothing here needs pandas.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.actions.presence import daemon_alive
from orchestrator.api.curves import COLUMNS as CURVE_COLUMNS
from orchestrator.api.curves import curve_points, point_row
from orchestrator.api.jobs import headline_metric
from orchestrator.api.submit import SubmitRequest, submit_sweep
from orchestrator.errors import OrchError, UsageError
from orchestrator.lifecycle import TERMINAL_STATES, JobState
from orchestrator.results.collect import RunReader
from orchestrator.store.db import Store
from orchestrator.store.job_facts import job_facts, job_states
from orchestrator.store.queries import list_jobs, result_jobs

JOB_COLUMNS = ("id", "suite", "config", "setting", "seed", "task", "state", "attempt", "level", "gpu", "run_s",
               "metric", "value", "reason")
RESULT_COLUMNS = ("suite", "config", "setting", "task", "seed", "job", "attempt", "level", "split", "metric", "value")


def _frame(rows: list[dict[str, Any]], columns: Sequence[str], as_frame: bool) -> Any:
    if not as_frame:
        return rows
    try:
        import pandas as pd
    except ImportError:
        raise OrchError("DataFrames need pandas: pip install 'orch[notebook]' (or pass as_frame=False for rows)") from None
    return pd.DataFrame(rows, columns=list(columns))


def setting_text(overrides: Mapping[str, Any]) -> str:
    """A job's overrides in one short line, `learning_rate=0.0003 lora_r=8` ('' for none)."""
    return " ".join(f"{key}={json.dumps(value)}" if not isinstance(value, (int, float)) or isinstance(value, bool)
                    else f"{key}={value!r}" for key, value in sorted(overrides.items()))


def _text(value: Any) -> str:
    """A Python value as `--set`/`--grid` text, which the configs' types then type."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"value {value!r} is not a finite number")
    return repr(value) if isinstance(value, float) else str(value)


class Sweep:
    """One state database (and optionally a plans folder) seen from Python."""

    def __init__(self, db: str | Path = "state.db", plans: str | Path | None = None) -> None:
        self.db_path = Path(db)
        self.plans_dir = Path(plans) if plans is not None else None
        self.submitted: list[int] = []  # job ids of this object's submits, for wait()

    def _store(self) -> Store:
        return Store(self.db_path, create=False)

    # -------------------------------------------------------------------------------- reading

    def jobs(self, suite: str | None = None, *, as_frame: bool = True) -> Any:
        """A row per job: id, suite, config, setting (its overrides), seed, task, state, attempt,
        level, gpu (while it runs), run_s, the headline metric and its value, reason."""
        with self._store() as store:
            listed = list_jobs(store, suite=suite)
            facts = job_facts(store, [j.id for j in listed], store.now_s())
        rows = []
        for job in listed:
            fact = facts[job.id]
            headline = headline_metric(fact.last_values)
            rows.append({"id": job.id, "suite": job.suite, "config": job.config_name,
                         "setting": setting_text(fact.overrides), "seed": job.seed, "task": job.data,
                         "state": job.state.value, "attempt": job.attempt_count, "level": job.level, "gpu": job.gpu,
                         "run_s": fact.run_s, "metric": headline[0] if headline else None,
                         "value": headline[1] if headline else None, "reason": job.reason})
        return _frame(rows, JOB_COLUMNS, as_frame)

    def results(self, suite: str | None = None, *, as_frame: bool = True) -> Any:
        """A row per succeeded run and metric: its test metrics (split "test") and, where its
        result.json has them, its validation metrics (split "val"). Per run: no run is pooled,
        dropped or averaged here."""
        reader = RunReader()
        rows: list[dict[str, Any]] = []
        with self._store() as store:
            runs = [run for run in result_jobs(store, suite) if run.succeeded and run.run_dir]
        for run in runs:
            assert run.run_dir is not None  # kept above: succeeded runs with a run dir
            base = {"suite": run.suite, "config": run.config, "setting": setting_text(reader.setting(run).overrides),
                    "task": run.data, "seed": run.seed, "job": run.job_id, "attempt": run.n, "level": run.level}
            reading = reader.reading(run.run_dir, run.output_metrics_json)
            for split, metrics in (("test", reading.metrics or {}), ("val", reading.val_metrics)):
                rows += [{**base, "split": split, "metric": name, "value": value} for name, value in metrics.items()]
        return _frame(rows, RESULT_COLUMNS, as_frame)

    def curves(self, jobs: Iterable[int] | None = None, suite: str | None = None, keys: Iterable[str] | None = None,
               *, stitched: bool = False, as_frame: bool = True) -> Any:
        """A row per reported point: job, attempt, step, key, value (`stitched`: one curve per
        job, a later attempt winning from its first step)."""
        with self._store() as store:
            points = curve_points(store, jobs=list(jobs) if jobs is not None else None, suite=suite,
                                  keys=list(keys) if keys is not None else None, stitched=stitched)
        return _frame([point_row(p) for p in points], CURVE_COLUMNS, as_frame)

    # -------------------------------------------------------------------------------- acting

    def submit(self, suite: str, pairs: Sequence[str] | str | None = None, sets: Mapping[str, Any] | None = None,
               grid: Mapping[str, Sequence[Any]] | None = None, *, force: bool = False, dry_run: bool = False,
               priority: int = 0, as_frame: bool = True) -> Any:
        """Queue suite × grid × pairs as `orch submit` does (idempotent unless `force`); a row
        per job: id, config, seed, task, setting, created, state. wait() waits for these."""
        request = SubmitRequest(
            suite, pairs if isinstance(pairs, str) or pairs is None else " ".join(pairs),
            tuple(f"{key}={_text(value)}" for key, value in (sets or {}).items()),
            tuple(f"{key}={','.join(_text(v) for v in values)}" for key, values in (grid or {}).items()),
            priority=priority, dry_run=dry_run, force=force)
        report = submit_sweep(request, self.db_path, self.plans_dir)
        rows = [{"id": o.job_id, "config": o.spec.config_name, "seed": o.spec.seed, "task": o.spec.data,
                 "setting": setting_text(o.spec.overrides), "created": o.created,
                 "state": "queued" if o.created else o.existing_state} for o in report.outcomes]
        if not dry_run:
            self.submitted += [o.job_id for o in report.outcomes if o.job_id is not None and o.job_id not in self.submitted]
        return _frame(rows, ("id", "config", "seed", "task", "setting", "created", "state"), as_frame)

    def wait(self, jobs: Iterable[int] | None = None, *, timeout_s: float | None = None, poll_s: float = 1.0,
             progress: bool = True, on_poll: Callable[[dict[int, str]], None] | None = None) -> dict[int, str]:
        """Until the jobs (default: those this object submitted) have ended; returns their states.
        A bar shows how many ended; refused at once when no daemon runs on the database."""
        wanted = list(jobs) if jobs is not None else list(self.submitted)
        if not wanted:
            return {}
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

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
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

