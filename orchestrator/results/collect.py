"""Reads every job of a results table into ResultRows, each traced to its attempt and to the
effective config of its job (the `--set` overrides and the config's content): a succeeded job's
result.json (test and val metrics, best_step), any other job's state and error.

result.json is written by user code: anything but a mapping of numbers under metrics.test is
counted as missing, never trusted. A progress line's bookkeeping (`step`, `epoch`, ...) is never
a result metric."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.attempts.printed_metrics import BOOKKEEPING_KEYS
from orchestrator.attempts.rundir_reads import read_result
from orchestrator.lifecycle import JobState
from orchestrator.plans.ladder_spec import LOGITS_KEY, logits_exact
from orchestrator.results.aggregate import ResultRow, setting_digest
from orchestrator.store.db import Store
from orchestrator.store.queries import ResultJob, result_jobs
from orchestrator.wording import number

NO_METRICS = "no test metrics (result.json or printed)"
# What the exact rungs change (results.aggregate's mark trusts the rest to change numerics);
# `logits_to_keep` only for the built-in workers (`plans.ladder_spec.logits_exact`)
EXACT_KEYS = frozenset({"gradient_checkpointing", "logits_to_keep", "num_data_workers"})
MAX_PEFT_BYTES = 1 << 20
MAX_ERROR_CHARS = 200  # a failed seed's error, as a results note shows it


@dataclass(frozen=True)
class RunReading:
    """What one succeeded attempt's run dir says: its finite metrics (None when it has none),
    whether its "test" split is the validation split, and the LoRA dropout it ran with (None
    when its result.json does not say), its val metrics and the step that chose its weights."""

    metrics: dict[str, float] | None
    test_is_val: bool = False
    lora_dropout: float | None = None
    val_metrics: dict[str, float] = field(default_factory=dict)
    best_step: int | None = None


@dataclass(frozen=True)
class Setting:
    """A job's effective setting: its `--set` overrides, their digest with the config's content,
    the worker command and the suite's env (results.setting_digest) and the LoRA dropout it asks for (used for runs whose result.json
    does not say)."""

    overrides: dict[str, Any]
    digest: str
    lora_dropout: float
    params: dict[str, Any] = field(default_factory=dict)  # the merged config and the overrides


class RunReader:
    """Reads each succeeded attempt's result.json once per process (it does not change after
    the attempt succeeded); a missing file is read again next time, as it may still appear."""

    def __init__(self, max_entries: int = 200_000) -> None:
        self._readings: dict[str, RunReading] = {}
        self._settings: dict[tuple[str, str, str, str, str, str], Setting] = {}
        self._errors: dict[str, str] = {}  # an ended attempt's error, by run dir: it never changes
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def reading(self, run_dir: str, printed_json: str | None = None) -> RunReading:
        with self._lock:
            if run_dir in self._readings:
                return self._readings[run_dir]
        result = read_result(Path(run_dir))
        test = job_metrics(result, printed_json)
        reported_dropout = number(result.get("lora_dropout")) if isinstance(result, dict) else None
        best_step = result.get("best_step") if isinstance(result, dict) else None
        reading = RunReading(None if test is None else finite_metrics(test),
                             isinstance(result, dict) and result.get("test_is_val") is True, reported_dropout,
                             val_metrics(result), best_step if isinstance(best_step, int) else None)
        with self._lock:
            if len(self._readings) >= self.max_entries:
                self._readings.clear()
            if reading.metrics is not None:
                self._readings[run_dir] = reading
        return reading

    def error(self, run_dir: str) -> str | None:
        """A failed attempt's `error` from its result.json (first line), read once; None without one."""
        with self._lock:
            if run_dir in self._errors:
                return self._errors[run_dir] or None
        result = read_result(Path(run_dir))
        error = result.get("error") if isinstance(result, dict) else None
        found = _first_line(error) if isinstance(error, str) else ""
        with self._lock:
            if len(self._errors) >= self.max_entries:
                self._errors.clear()
            self._errors[run_dir] = found
        return found or None

    def setting(self, run: ResultJob) -> Setting:
        """The job's effective config, worked out once per distinct stored text (the jobs of a
        config × overrides share it whatever their seed and task)."""
        key = (run.setting_json, run.job_overrides_json, run.config_path, run.env_json, run.worker, run.not_science_json)
        with self._lock:
            found = self._settings.get(key)
        if found is None:
            config, overrides = _loads_mapping(run.setting_json), _loads_mapping(run.job_overrides_json)
            # keys the suite calls not science (paths, simulated time) never split a row
            aside = _not_science(run.not_science_json)
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


def collect_rows(store: Store, suite: str | None = None, reader: RunReader | None = None) -> tuple[list[ResultRow], int]:
    """(rows, how many succeeded jobs had no usable test metrics): one row per submitted job.
    A succeeded job without metrics is a row too, with the reason, so its effective config's row
    says why it is short; a failed or cancelled job carries its error, a queued or running one
    its state."""
    reader = reader or RunReader()
    rows: list[ResultRow] = []
    missing = 0
    for run in result_jobs(store, suite):
        setting = reader.setting(run)
        if run.state is not JobState.SUCCEEDED or run.run_dir is None:
            state = run.state if run.state is not JobState.SUCCEEDED else JobState.FAILED
            rows.append(ResultRow(
                run.suite, run.config, run.data, run.seed, {}, job=run.job_id, attempt=run.n, level=run.level,
                step=run.level_step, overrides=setting.overrides, setting=setting.digest,
                lora_dropout=setting.lora_dropout, state=state, reason=_error_of(run, reader), params=setting.params,
            ))  # fmt: skip
            continue
        reading = reader.reading(run.run_dir, run.output_metrics_json)
        if reading.metrics is None:
            missing += 1
        provenance = provenance_keys(run.provenance_json)
        rows.append(ResultRow(
            run.suite, run.config, run.data, run.seed, reading.metrics or {},
            job=run.job_id, attempt=run.n, level=run.level, step=run.level_step,
            changes=run.overrides, run_alone=run.run_alone, overrides=setting.overrides,
            setting=setting.digest, test_is_val=reading.test_is_val,
            lora_dropout=setting.lora_dropout if reading.lora_dropout is None else reading.lora_dropout,
            no_metrics=NO_METRICS if reading.metrics is None else None, inexact=inexact_of(run),
            val_metrics=reading.val_metrics, best_step=reading.best_step, params=setting.params,
            diverged=run.diverged, code=provenance.get("code"), libraries=provenance.get("libraries"),
            level_note=run.level_note,
        ))  # fmt: skip
    return rows, missing


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


def _error_of(run: ResultJob, reader: RunReader) -> str:
    """A failed or cancelled job's error: its latest attempt's result.json `error` (the
    worker's own words, first line), else the job's reason; "" for a job still going."""
    if run.state in (JobState.QUEUED, JobState.RUNNING):
        return ""
    if run.state is JobState.FAILED and run.run_dir and (error := reader.error(run.run_dir)):
        return error
    return _first_line(run.reason or "")


def _first_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """The first non-blank line of an error written by user code, without control characters
    (an ANSI escape would reach the terminal) and cut at `limit`."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    line = "".join(ch if ch.isprintable() else " " for ch in line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def val_metrics(result: dict[str, Any] | None) -> dict[str, float]:
    """The finite metrics a result.json reports on the validation split: `metrics.val`, or the
    `val_X` keys of a flat `metrics` mapping."""
    if not isinstance(result, dict) or not isinstance(result.get("metrics"), dict):
        return {}
    reported = result["metrics"]
    if isinstance(reported.get("val"), dict):
        return finite_metrics(reported["val"])
    flat = {key[len("val_"):]: value for key, value in reported.items() if isinstance(key, str) and key.startswith("val_")}
    return finite_metrics(flat)


def job_metrics(result: dict[str, Any] | None, printed_json: str | dict[str, Any] | None, *,
                aliases: bool = True) -> dict[str, Any] | None:
    """A job's metrics: result.json's `metrics.test` (or a flat `metrics` of numbers), else what
    its script printed (parsed when the attempt ended); `eval_X` and `test_X` also count as X
    (unless `aliases` is off: the metrics as reported, each once)."""
    metrics: Any = None
    if isinstance(result, dict) and isinstance(result.get("metrics"), dict):
        reported = result["metrics"]
        metrics = reported.get("test") if isinstance(reported.get("test"), dict) else reported
    if not metrics and isinstance(printed_json, dict):
        metrics = printed_json  # parsed already (a typed Attempt's output_metrics)
    elif not metrics and isinstance(printed_json, str) and printed_json:
        with contextlib.suppress(ValueError):
            metrics = json.loads(printed_json)
    if not isinstance(metrics, dict) or not metrics:
        return None
    named = dict(metrics)
    for key, value in metrics.items() if aliases else ():
        for prefix in ("test_", "eval_"):
            if isinstance(key, str) and key.startswith(prefix):
                named.setdefault(key[len(prefix):], value)
    return named


def finite_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers among a job's metrics (written by user code: NaN, infinities, ints
    too large for a float and non-numbers are left out, never shown or averaged), without a
    training loop's bookkeeping (`step`, `epoch`, `learning_rate`, ...)."""
    kept: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and str(key) not in BOOKKEEPING_KEYS:
            finite = number(value)
            if finite is not None:
                kept[str(key)] = finite
    return kept


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
