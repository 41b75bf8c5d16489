"""Reads every job of a results table into ResultRows, each traced to its attempt and to the
effective config of its job (the `--set` overrides and the config's content): a succeeded job's
test and val metrics and best_step, any other job's state and error.

What an attempt reported is read from its run dir once, when its end is recorded
(attempts.reported, stored in attempts.reported_json): a table never reopens a run dir. An
attempt that ended before readings were stored is read from its run dir once (RunReader) and
its reading stored then (backfilled, where the database is writable and the run dir had one);
the table counts how many were read so (`Collected.from_run_dirs`)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.attempts.reported import (
    PRINTED_SPLITS_NOTE,
    RunReading,
    finite_metrics,
    first_line,
    job_metrics,
    reading_from_record,
    reading_of,
    val_metrics,
)
from orchestrator.attempts.rundir_reads import IGNORED_FILES, read_result
from orchestrator.errors import StoreError
from orchestrator.lifecycle import JobState
from orchestrator.plans.ladder_spec import LOGITS_KEY, logits_exact
from orchestrator.results.aggregate import ResultRow, setting_digest
from orchestrator.store.attempts import backfill_reported
from orchestrator.store.db import Store
from orchestrator.store.queries import ResultJob, not_science_texts, result_jobs
from orchestrator.wording import number

__all__ = [
    "PRINTED_SPLITS_NOTE",
    "RunReader",
    "RunReading",
    "collect_rows",
    "finite_metrics",
    "job_metrics",
    "val_metrics",
]

NO_METRICS = "no test metrics (result.json or printed)"
# What the exact rungs change (results.aggregate's mark trusts the rest to change numerics);
# `logits_to_keep` only for the built-in workers (`plans.ladder_spec.logits_exact`)
EXACT_KEYS = frozenset({"gradient_checkpointing", "logits_to_keep", "num_data_workers"})
MAX_PEFT_BYTES = 1 << 20
ENDED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)  # an attempt of these has a reading


@dataclass(frozen=True)
class Setting:
    """A job's effective setting: its `--set` overrides, their digest with the config's content,
    the worker command and the suite's env (results.setting_digest) and the LoRA dropout it asks
    for (used for runs whose result.json does not say)."""

    overrides: dict[str, Any]
    digest: str
    lora_dropout: float
    params: dict[str, Any] = field(default_factory=dict)  # the merged config and the overrides


class RunReader:
    """Works out each job's effective setting once per distinct stored text, and reads the
    result.json of an attempt that ended before readings were stored once per process (it does
    not change after the attempt ended); a missing file is read again next time."""

    def __init__(self, max_entries: int = 200_000) -> None:
        self._readings: dict[str, RunReading] = {}
        self._stored: dict[str, RunReading] = {}  # by the stored text: it never changes
        self._settings: dict[tuple[str, str, str, str, str, frozenset[str]], Setting] = {}
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def reading(self, run_dir: str, printed_json: str | None = None) -> RunReading:
        """An attempt's reading from its run dir (for attempts that ended before readings were
        stored at their end)."""
        with self._lock:
            if run_dir in self._readings:
                return self._readings[run_dir]
        reading = reading_of(read_result(Path(run_dir)), printed_json)
        with self._lock:
            if len(self._readings) >= self.max_entries:
                self._readings.clear()
            if reading.metrics is not None or reading.error:
                self._readings[run_dir] = reading
        return reading

    def stored(self, text: str | None) -> RunReading | None:
        """A reading stored at an attempt's end, parsed once per process per distinct text."""
        if not text:
            return None
        with self._lock:
            found = self._stored.get(text)
        if found is None:
            found = reading_from_record(text)
            if found is None:
                return None
            with self._lock:
                if len(self._stored) >= self.max_entries:
                    self._stored.clear()
                self._stored[text] = found
        return found

    def setting(self, run: ResultJob, aside: frozenset[str]) -> Setting:
        """The job's effective config, worked out once per distinct stored text (the jobs of a
        config × overrides share it whatever their seed and task). `aside`: the keys its suite
        calls not science, over all of its jobs (`not_science_keys`)."""
        key = (
            run.setting_json,
            run.job_overrides_json,
            run.config_path,
            run.env_json,
            run.worker,
            aside,
        )
        with self._lock:
            found = self._settings.get(key)
        if found is None:
            config, overrides = _loads_mapping(run.setting_json), _loads_mapping(run.job_overrides_json)
            # keys the suite calls not science (paths, simulated time) never split a row
            config = {k: v for k, v in config.items() if k not in aside}
            overrides = {k: v for k, v in overrides.items() if k not in aside}
            env = {str(k): str(v) for k, v in _loads_mapping(run.env_json).items()}
            found = Setting(overrides, setting_digest(config, overrides, run.worker, env),
                            lora_dropout_of(config, run.config_path), {**config, **overrides})
            with self._lock:
                if len(self._settings) >= self.max_entries:
                    self._settings.clear()
                self._settings[key] = found
        return found


@dataclass(frozen=True)
class Collected:
    """Every submitted job as a ResultRow, and how many attempts had to be read from their run
    dirs (ended before readings were stored at their end). How many succeeded jobs had no usable
    test metrics is counted over the rows a table shows (results.table.no_metric_jobs)."""

    rows: list[ResultRow]
    from_run_dirs: int = 0
    printed_splits: bool = False  # some run's printed eval_*/test_* were read as val and test


def collect_rows(store: Store, suite: str | None = None, reader: RunReader | None = None) -> Collected:
    """One row per submitted job. A succeeded job without metrics is a row too, with the reason,
    so its effective config's row says why it is short; a failed or cancelled job carries its
    error, a queued or running one its state."""
    reader = reader or RunReader()
    rows: list[ResultRow] = []
    from_run_dirs = 0
    splits_read = False
    backfill: list[tuple[int, int, dict[str, Any]]] = []
    runs = result_jobs(store, suite)
    aside = not_science_keys(runs)
    for run in runs:
        setting = reader.setting(run, aside.get(run.suite, frozenset()))
        reading = reader.stored(run.reported_json)
        if reading is None and run.run_dir is not None and run.n is not None and run.state in ENDED:
            from_run_dirs += 1
            reading = reader.reading(run.run_dir, run.output_metrics_json)
            if reading.metrics is not None or reading.error:  # found: kept, never read again
                backfill.append((run.job_id, run.n, reading.to_record()))
        if run.state is not JobState.SUCCEEDED or run.run_dir is None:
            state = run.state if run.state is not JobState.SUCCEEDED else JobState.FAILED
            rows.append(ResultRow(
                run.suite, run.config, run.data, run.seed, {}, job=run.job_id, attempt=run.n, level=run.level,
                step=run.level_step, overrides=setting.overrides, setting=setting.digest,
                lora_dropout=setting.lora_dropout, state=state, reason=_error_of(run, reading),
                params=setting.params,
            ))  # fmt: skip
            continue
        assert reading is not None  # a succeeded job's attempt has ended
        splits_read = splits_read or reading.printed_splits
        provenance = provenance_keys(run.provenance_json)
        rows.append(ResultRow(
            run.suite, run.config, run.data, run.seed, reading.metrics or {},
            job=run.job_id, attempt=run.n, level=run.level, step=run.level_step,
            changes=run.overrides, run_alone=run.run_alone, overrides=setting.overrides,
            setting=setting.digest, test_is_val=reading.test_is_val,
            lora_dropout=setting.lora_dropout if reading.lora_dropout is None else reading.lora_dropout,
            no_metrics=no_metrics_why(run.attempt_reason) if reading.metrics is None else None, inexact=inexact_of(run),
            val_metrics=reading.val_metrics, best_step=reading.best_step, params=setting.params,
            diverged=run.diverged, code=provenance.get("code"), libraries=provenance.get("libraries"),
            level_note=run.level_note, fused=reading.fused_members, nonfinite=reading.nonfinite_test,
            val_nonfinite=reading.nonfinite_val,
        ))  # fmt: skip
    if backfill:
        with contextlib.suppress(StoreError):  # a read-only or busy database: read again next time
            backfill_reported(store, backfill)
    return Collected(rows, from_run_dirs, splits_read)


def job_settings(store: Store, suites: Collection[str], job_ids: Collection[int],
                 reader: RunReader | None = None) -> dict[int, Setting]:
    """The effective setting of each of these jobs (of these suites), as `orch results` tells its
    rows apart: jobs of one digest are seeds of one setting, and only they are pooled. Only these
    jobs are read, and their suites' not-science lists."""
    reader = reader or RunReader()
    wanted = sorted(set(job_ids))
    settings: dict[int, Setting] = {}
    for suite in sorted(set(suites)):
        aside = frozenset().union(*(_not_science(text) for text in not_science_texts(store, suite)))
        settings.update({run.job_id: reader.setting(run, aside) for run in result_jobs(store, suite, wanted)})
    return settings


def no_metrics_why(attempt_reason: str | None) -> str:
    """Why a succeeded run has no metrics: none reported, or the files it wrote that orch
    ignored (a result.json too large, not JSON, a link), as its attempt's end named them."""
    ignored = (attempt_reason or "").partition(IGNORED_FILES)[2]
    return f"{NO_METRICS}; {IGNORED_FILES}{first_line(ignored, 300)}" if ignored else NO_METRICS


def provenance_keys(stored: str | None) -> dict[str, str | None]:
    """What results compare of a run's provenance (stored validated at its end): its code and
    its library versions, each one line; None where unknown."""
    digest = _loads_mapping(stored) if stored else {}
    return {name: value if isinstance(value := digest.get(name), str) else None for name in ("code", "libraries")}


def inexact_of(run: ResultJob) -> tuple[str, ...]:
    """The rungs changing numerics the run went through, as its attempt recorded them; for an
    attempt recorded before they were (None), its level's rung where the level changed anything
    but what exact rungs change: a mark too many, never one too few."""
    if run.inexact_rungs is not None:
        return run.inexact_rungs
    exact_keys = EXACT_KEYS if logits_exact(run.worker) else EXACT_KEYS - {LOGITS_KEY}
    if any(key not in exact_keys for key in run.overrides):
        return (run.level_step or f"level {run.level}",)
    return ()


def _error_of(run: ResultJob, reading: RunReading | None) -> str:
    """A failed or cancelled job's error: its latest attempt's result.json `error` (the
    worker's own words, first line), else the job's reason; "" for a job still going."""
    if run.state in (JobState.QUEUED, JobState.RUNNING):
        return ""
    if run.state is JobState.FAILED and reading is not None and reading.error:
        return reading.error
    return first_line(run.reason or "")


def lora_dropout_of(config: dict[str, Any], config_path: str) -> float:
    """The LoRA dropout a config asks for, for a run whose result.json does not say: a top-level
    `lora_dropout`, the `peft` mapping, or the `peft` JSON file next to the config; 0 when none."""
    raw = config.get("lora_dropout")
    if raw not in (None, "") and (value := number(raw)) is not None:
        return value
    spec = config.get("peft")
    if isinstance(spec, str) and config_path:
        spec = _peft_file(Path(config_path).parent, spec)
    if isinstance(spec, dict):
        value = number(spec.get("lora_dropout", spec.get("dropout")))
        return value if value is not None else 0.0
    return 0.0


def _peft_file(config_dir: Path, name: str) -> dict[str, Any] | None:
    """A plan's LoRA spec file (the user's own plans, read bounded and never through a symlink)."""
    path = Path(name) if Path(name).is_absolute() else config_dir / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        try:
            raw = handle.read(MAX_PEFT_BYTES + 1)
        except OSError:
            return None
    if len(raw) > MAX_PEFT_BYTES:
        return None
    with contextlib.suppress(UnicodeDecodeError, ValueError, RecursionError):
        return _dict(json.loads(raw.decode("utf-8")))
    return None


def not_science_keys(runs: Sequence[ResultJob]) -> dict[str, frozenset[str]]:
    """Per suite, the keys any of its jobs was submitted calling not science: a list changed
    between submits sets the same keys aside in every run of the suite, so a row is never split
    by when its seeds were queued (nor a `--force` rerun kept apart from the seed it replaces)."""
    texts: dict[str, set[str]] = {}
    for run in runs:
        texts.setdefault(run.suite, set()).add(run.not_science_json)
    return {suite: frozenset().union(*(_not_science(text) for text in found)) for suite, found in texts.items()}


def _not_science(text: str) -> frozenset[str]:
    try:
        keys = json.loads(text)
    except (ValueError, RecursionError):
        return frozenset()
    return frozenset(k for k in keys if isinstance(k, str)) if isinstance(keys, list) else frozenset()


def _dict(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _loads_mapping(text: str) -> dict[str, Any]:
    try:
        return _dict(json.loads(text)) or {}
    except (ValueError, RecursionError):
        return {}
