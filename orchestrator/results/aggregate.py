"""Aggregates worker results over seeds: one summary per effective setting × task. Pure: no I/O.

A summary (one row of every results format) is one effective config: the suite, the config, the
`--set` overrides of its jobs and the config's content as submitted. Runs whose settings differ
are never pooled. Ladder levels keep the science (the effective batch), so the runs of one
setting at different levels are pooled, and the summary says which levels they ran at. Every
succeeded run of a setting is counted: a seed that ran twice (a forced resubmission) counts
twice, and the summary says so.

The metric follows the GLUE convention for the task: Matthews correlation for CoLA, F1 for MRPC
and QQP, accuracy for the rest. When none of a row's runs reported that metric, the row shows
accuracy, else the first metric its runs reported; for a benchmark's task (`glue_mrpc`) its
notes say so (a script's own task, `toy`, just names the metric it shows).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from orchestrator.wording import fmt_value

PRIMARY_METRICS = {"cola": "mcc", "mrpc": "f1", "qqp": "f1"}
DEFAULT_METRIC = "accuracy"
_TASK = re.compile(r"^[a-z0-9-]+_([a-z0-9]+?)(?:_\d+)?$")
PAIR_KEYS = ("seed", "data")  # what differs between the jobs of one setting


@dataclass(frozen=True)
class ResultRow:
    """One succeeded run: the metrics of its result.json (or what it printed), and where it came from."""

    suite: str
    config: str
    task: str  # the data name as submitted, e.g. "glue-tvt_qnli"
    seed: int
    metrics: Mapping[str, float]  # the "test" metrics of one result.json
    # Where the value came from, so every cell can be traced to the attempt that made it.
    job: int | None = None
    attempt: int | None = None
    level: int | None = None  # ladder level the succeeding attempt ran at
    step: str | None = None  # that level's rung name
    changes: Mapping[str, Any] = field(default_factory=dict)  # every ladder override vs. the config
    run_alone: bool = False
    overrides: Mapping[str, Any] = field(default_factory=dict)  # the job's `--set` overrides (env.* too)
    setting: str = ""  # digest of the job's effective config (setting_digest); "" when unknown
    test_is_val: bool = False  # result.json said its test split is the validation split
    lora_dropout: float = 0.0  # the config's LoRA dropout (draws depend on the micro-batch)
    no_metrics: str | None = None  # why this succeeded run has no metric at all
    diverged: str | None = None  # why the divergence rule flagged its loss
    code: str | None = None  # provenance: the worker's commit (`+dirty`), "not a git repository"; None: unknown
    libraries: str | None = None  # provenance: its library versions, in one line; None: unknown


@dataclass(frozen=True)
class SeedRun:
    """One run of a summary: its value and the attempt (and ladder level) that produced it."""

    seed: int
    value: float | None
    job: int | None
    attempt: int | None
    level: int | None
    step: str | None
    changes: Mapping[str, Any]
    run_alone: bool
    test_is_val: bool = False
    diverged: str | None = None
    code: str | None = None
    libraries: str | None = None


@dataclass(frozen=True)
class ResultSummary:
    """One row: an effective setting on one task, mean ± sample std of `metric` over `runs`."""

    suite: str
    config: str
    task: str
    metric: str  # the metric shown: the task's `primary`, or the fallback the notes name
    mean: float | None  # None when no run reported the metric
    std: float  # sample standard deviation; 0.0 for fewer than two runs
    n: int  # runs counted: exactly `runs`
    seeds: tuple[int, ...]  # one per run counted, sorted (a seed that ran twice appears twice)
    runs: tuple[SeedRun, ...] = ()  # every run counted, by seed then job
    overrides: Mapping[str, Any] = field(default_factory=dict)  # `--set` overrides of every job in the row
    overrides_label: str = ""  # `learning_rate=0.001, env.X=1`; "" without overrides
    variant: str = ""  # `content 1a2b3c4d` when the config's content changed between submits
    notes: tuple[str, ...] = ()  # sentences a reader must see: fallback metric, repeats, runs left out
    uncounted: tuple[SeedRun, ...] = ()  # succeeded runs that did not report `metric`
    primary: str = DEFAULT_METRIC  # the task's conventional metric
    lora_dropout: float = 0.0

    @property
    def n_seeds(self) -> int:
        """Runs counted (the name the `--json` and CSV outputs have always used)."""
        return self.n

    @property
    def label(self) -> str:
        """The row's name in a grid: `r8 [learning_rate=0.001]`."""
        extra = ", ".join(part for part in (self.overrides_label, self.variant) if part)
        return f"{self.config} [{extra}]" if extra else self.config

    @cached_property
    def levels(self) -> tuple[int, ...]:
        """The distinct ladder levels this row's runs ran at (host steps count as a change)."""
        return tuple(sorted({r.level for r in self.runs if r.level is not None}))

    @cached_property
    def mixed_levels(self) -> bool:
        """True when the runs did not all run with the same settings: a reader must know."""
        shapes = {(r.level, tuple(sorted((k, repr(v)) for k, v in r.changes.items())), r.run_alone) for r in self.runs}
        return len(shapes) > 1

    @property
    def dropout_differs(self) -> bool:
        """Mixed levels with LoRA dropout on: the dropout draws differ at other micro-batch sizes."""
        return self.mixed_levels and self.lora_dropout > 0

    @property
    def test_is_val(self) -> bool:
        """Some counted run scored its "test" metrics on the validation split."""
        return any(r.test_is_val for r in self.runs)

    @property
    def diverged(self) -> tuple[SeedRun, ...]:
        """Counted runs whose loss the divergence rule flagged."""
        return tuple(r for r in self.runs if r.diverged)

    @property
    def mixed_provenance(self) -> bool:
        """The counted runs ran different code (commits, dirty trees) or library versions."""
        return any(len({v for r in self.runs if (v := getattr(r, name)) is not None}) > 1
                   for name in ("code", "libraries"))

    @property
    def repeated_seeds(self) -> dict[int, int]:
        """Seeds counted more than once, with how many runs each."""
        counts: dict[int, int] = {}
        for seed in self.seeds:
            counts[seed] = counts.get(seed, 0) + 1
        return {seed: count for seed, count in counts.items() if count > 1}


def primary_metric(task: str) -> str:
    """`glue-tvt_mrpc_1000` -> "f1"; unknown names fall back to accuracy."""
    match = _TASK.match(task.lower())
    base = match.group(1) if match else task.lower()
    return PRIMARY_METRICS.get(base, DEFAULT_METRIC)


def setting_digest(
    config: Mapping[str, Any], overrides: Mapping[str, Any], worker: str = "", env: Mapping[str, str] | None = None,
) -> str:
    """A short digest of an effective setting: the merged config without seed and data, the
    overrides (env.* ones reach only the environment), the worker command the run ran and the
    environment its suite gave it (without orch's own `ORCH_*` names). Equal digests, equal
    settings: `orch retry` may give a job a changed command or env, and its runs are not pooled
    with runs of the old one."""
    effective = {k: v for k, v in config.items() if k not in PAIR_KEYS}
    own_env = {k: v for k, v in (env or {}).items() if not k.startswith("ORCH_")}
    text = json.dumps({"config": effective, "overrides": dict(overrides), "worker": worker, "env": own_env},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _label_value(value: Any) -> str:
    shown = fmt_value(value)
    if isinstance(value, float) and float(shown) != value:
        return repr(value)  # two settings must never read the same
    return shown


def overrides_label(overrides: Mapping[str, Any]) -> str:
    """`{"learning_rate": 1e-3}` -> `learning_rate=0.001`, keys sorted; "" without overrides."""
    return ", ".join(f"{key}={_label_value(overrides[key])}" for key in sorted(overrides))


def choose_metric(task: str, rows: list[ResultRow]) -> tuple[str, str | None]:
    """The metric a row shows and, when it is not the task's own, the note that says so."""
    primary = primary_metric(task)
    if any(primary in row.metrics for row in rows):
        return primary, None
    # A benchmark's task (`glue_mrpc`) has a metric a reader expects; a script's own task
    # (`toy`) shows what its runs report, and the metric column says which.
    named = _TASK.match(task.lower()) is not None
    if any(DEFAULT_METRIC in row.metrics for row in rows):
        return DEFAULT_METRIC, f"no run reported {primary}: {DEFAULT_METRIC} shown" if named else None
    for row in rows:  # the first metric its runs report
        if row.metrics:
            first = next(iter(row.metrics))
            return first, f"no run reported {primary}: {first} shown" if named else None
    return primary, None


def aggregate(rows: Iterable[ResultRow]) -> list[ResultSummary]:
    """One summary per (suite, config, overrides, config content, task), sorted that way."""
    groups: dict[tuple[str, str, str, str, str], list[ResultRow]] = {}
    labels: dict[int, str] = {}  # rows of one job's setting share one overrides mapping
    for row in rows:
        label = labels.get(id(row.overrides))
        if label is None:
            label = labels[id(row.overrides)] = overrides_label(row.overrides)
        groups.setdefault((row.suite, row.config, label, row.task, row.setting), []).append(row)
    # The same config and overrides run with different content, worker command or env: name the setting.
    contents: dict[tuple[str, str, str], set[str]] = {}
    for suite, config, label, _, setting in groups:
        contents.setdefault((suite, config, label), set()).add(setting)
    summaries = []
    for key in sorted(groups):
        suite, config, label, _, setting = key
        variant = f"setting {setting}" if len(contents[(suite, config, label)]) > 1 and setting else ""
        summaries.append(_summarise(groups[key], label, variant))
    return summaries


def _run(row: ResultRow, value: float | None) -> SeedRun:
    return SeedRun(seed=row.seed, value=value, job=row.job, attempt=row.attempt, level=row.level, step=row.step,
                   changes=dict(row.changes), run_alone=row.run_alone, test_is_val=row.test_is_val,
                   diverged=row.diverged, code=row.code, libraries=row.libraries)


def _summarise(rows: list[ResultRow], label: str, variant: str) -> ResultSummary:
    first = rows[0]
    metric, fallback_note = choose_metric(first.task, rows)
    ordered = sorted(rows, key=lambda r: (r.seed, r.job if r.job is not None else -1))
    counted = [_run(r, float(r.metrics[metric])) for r in ordered if metric in r.metrics]
    uncounted = [(r, _run(r, None)) for r in ordered if metric not in r.metrics]
    values = [r.value for r in counted if r.value is not None]
    mean = sum(values) / len(values) if values else None
    std = 0.0
    if mean is not None and len(values) > 1:
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    notes: list[str] = []
    if fallback_note:
        notes.append(fallback_note)
    summary = ResultSummary(
        suite=first.suite, config=first.config, task=first.task, metric=metric, mean=mean, std=std,
        n=len(counted), seeds=tuple(r.seed for r in counted), runs=tuple(counted),
        overrides=dict(first.overrides), overrides_label=label, variant=variant,
        uncounted=tuple(run for _, run in uncounted), primary=primary_metric(first.task),
        lora_dropout=max(r.lora_dropout for r in rows),
    )
    jobs_by_seed: dict[int, list[str]] = {}
    for run in counted:
        jobs_by_seed.setdefault(run.seed, []).append(str(run.job) if run.job is not None else "")
    for seed, jobs in jobs_by_seed.items():  # in seed order
        if len(jobs) > 1:
            named = ", ".join(filter(None, jobs))
            notes.append(f"seed {seed} ran {_times(len(jobs))}{f' (jobs {named})' if named else ''}: every run counted")
    for run in summary.diverged:
        notes.append(f"seed {run.seed}" + (f" (job {run.job})" if run.job is not None else "")
                     + f": loss diverged, {run.diverged}: counted, marked")
    if summary.mixed_provenance:
        notes.append("runs differ in " + " and ".join(
            name for name, attr in (("code", "code"), ("library versions", "libraries"))
            if len({getattr(r, attr) for r in summary.runs if getattr(r, attr) is not None}) > 1)
            + " (`orch results --json` lists each run's)")
    for row, _ in uncounted:
        where = f"seed {row.seed}" + (f" (job {row.job})" if row.job is not None else "")
        why = row.no_metrics or ("no finite metric" if not row.metrics else f"no {metric}")
        notes.append(f"{where} reported {why}: not counted")
    return replace(summary, notes=tuple(notes))


def _times(count: int) -> str:
    return "twice" if count == 2 else f"{count} times"
