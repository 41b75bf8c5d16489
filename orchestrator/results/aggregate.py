"""Aggregates worker results over seeds: one summary per effective setting × task. Pure: no I/O.

A summary (one row of every results format) is one effective config: the suite, the config, the
`--set` overrides of its jobs and the config's content as submitted. Runs whose settings differ
are never pooled. Ladder levels keep the science (the effective batch), so the runs of one
setting at different levels are pooled; the summary says which levels they ran at and which
rungs that change numerics (half batch: an equivalent draw, not bit-equal) they went through. Every
submitted job of a setting is in its row: one value per seed (the latest succeeded run of the
seed, results.seeds), and every seed that failed, was cancelled or has not finished is named in
the row's denominator; a setting none of whose runs succeeded still has its row. `pooled`
counts every succeeded run instead (n = runs), and the row says so.

Rows come in the order their jobs were submitted: a suite's configs in the suite's order (r8,
r16, r64), tasks in the order of the pairs; names compare with their numbers as numbers when
no job id says.

The metric follows the GLUE convention for the task: Matthews correlation for CoLA, F1 for MRPC
and QQP, accuracy for the rest. When none of a row's runs reported that metric, the row shows
accuracy, else the first metric its runs reported; for a benchmark's task (`glue_mrpc`) its
notes say so (a script's own task, `toy`, just names the metric it shows).

A metric a run reported as a number that is not finite (NaN, an infinity) or beyond
wording.MAX_METRIC is no value to average: that run is missing from the metric's mean and a note
names the value, but its other finite metrics still count, its val among them (the val mean then
counts a run the test mean does not).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from orchestrator.attempts.reported import missing_said, nonfinite_said
from orchestrator.lifecycle import JobState
from orchestrator.results.seeds import (
    PENDING,
    Denominator,
    SeedRunInput,
    SeedState,
    SeedStatus,
    counted_runs,
    denominator,
    full_denominator,
    later_run_notes,
    lost_runs,
    pruned_notes,
    seed_states,
    seed_text,
    short_denominator,
    uncounted_notes,
)
from orchestrator.spread import sample_std
from orchestrator.wording import fmt_value

PRIMARY_METRICS = {"cola": "mcc", "mrpc": "f1", "qqp": "f1"}
DEFAULT_METRIC = "accuracy"
_TASK = re.compile(r"^[a-z0-9-]+_([a-z0-9]+?)(?:_\d+)?$")
PAIR_KEYS = ("seed", "data")  # what differs between the jobs of one setting


@dataclass(frozen=True)
class ResultRow:
    """One submitted run: for a succeeded one the metrics of its result.json (or what it
    printed), and where it came from; for any other its state and why."""

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
    state: JobState = JobState.SUCCEEDED  # the job's state: only succeeded runs have metrics
    reason: str = ""  # why a failed or cancelled job ended so (its error)
    val_metrics: Mapping[str, float] = field(default_factory=dict)  # the "val" metrics of result.json
    best_step: int | None = None  # the step whose val score chose the weights tested
    params: Mapping[str, Any] = field(default_factory=dict)  # the effective config (for --where)
    inexact: tuple[str, ...] = ()  # ladder rungs that change numerics the run went through
    diverged: str | None = None  # why the divergence rule flagged its loss
    code: str | None = None  # provenance: the worker's commit (`+dirty`), "not a git repository"; None: unknown
    libraries: str | None = None  # provenance: its library versions, in one line; None: unknown
    level_note: str | None = None  # why its job started above level 0 ("started at level 2: …")
    # trained in a fused group (`share_base: fused`): the largest group (0: not said); None: not
    fused: int | None = None
    # metrics reported as numbers that are not finite or too large: name -> what they were (`nan`, `1e+305`)
    nonfinite: Mapping[str, str] = field(default_factory=dict)  # on the test split
    val_nonfinite: Mapping[str, str] = field(default_factory=dict)


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
    val: float | None = None  # the same metric on the validation split, when reported
    best_step: int | None = None
    inexact: tuple[str, ...] = ()  # ladder rungs that change numerics it went through
    diverged: str | None = None
    code: str | None = None
    libraries: str | None = None
    level_note: str | None = None
    fused: int | None = None  # trained in a fused group of up to this many (0: not said); None: not


@dataclass(frozen=True)
class ResultSummary:
    """One row: an effective setting on one task, mean ± sample std of `metric` over `runs`."""

    suite: str
    config: str
    task: str
    metric: str  # the metric shown: the task's `primary`, or the fallback the notes name
    mean: float | None  # None when no run reported the metric
    std: float | None  # sample standard deviation; None for fewer than two runs
    n: int  # values counted: exactly `runs` (distinct seeds unless pooled)
    seeds: tuple[int, ...]  # one per run counted, sorted (pooled: a seed that ran twice appears twice)
    runs: tuple[SeedRun, ...] = ()  # every run counted, by seed then job
    overrides: Mapping[str, Any] = field(default_factory=dict)  # `--set` overrides of every job in the row
    overrides_label: str = ""  # `learning_rate=0.001, env.X=1`; "" without overrides
    variant: str = ""  # `content 1a2b3c4d` when the config's content changed between submits
    notes: tuple[str, ...] = ()  # sentences a reader must see: fallback metric, repeats, runs left out
    uncounted: tuple[SeedRun, ...] = ()  # succeeded runs that did not report `metric`
    primary: str = DEFAULT_METRIC  # the task's conventional metric
    lora_dropout: float = 0.0
    seed_states: tuple[SeedState, ...] = ()  # every submitted seed, by seed
    denominator: Denominator = field(default_factory=lambda: Denominator(0))
    pooled: bool = False  # every succeeded run counted, not one per seed
    unfinished: bool = False  # some job of the row is queued or running
    failed_runs: bool = False  # some seed failed, was cancelled or reported no metric, or a later run did
    val_mean: float | None = None  # mean of the metric on the validation split, over the runs that report it
    val_std: float | None = None
    val_n: int = 0
    order: tuple[Any, ...] = ()  # where the row goes: its jobs' submission order (suite order)
    task_order: tuple[Any, ...] = ()  # where its task's column goes
    setting: str = ""  # the digest of its effective setting (ResultRow.setting)
    # runs whose val counts in val_mean though their test value was not finite (not in `runs`)
    val_only: tuple[SeedRun, ...] = ()

    @property
    def n_seeds(self) -> int:
        """Values counted (the name the `--json` and CSV outputs have always used)."""
        return self.n

    @property
    def distinct_seeds(self) -> int:
        """Distinct seeds counted (fewer than `n` where pooled runs repeat a seed)."""
        return len(set(self.seeds))

    @property
    def n_text(self) -> str:
        """What an n column shows: `3`, or `3 of 4 (seed 4 failed)`."""
        return short_denominator(self.n, self.seed_states, self.metric, self.pooled)

    @property
    def accounted(self) -> str:
        """Every submitted seed accounted for: `3 of 4; seed 4 (job 9) failed: RuntimeError: …`."""
        return full_denominator(self.n, self.seed_states, self.metric, self.pooled)

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

    @cached_property
    def inexact_rungs(self) -> tuple[str, ...]:
        """The rungs that change numerics some counted run went through, in the order met: not
        empty, the row's value is an equivalent draw, not what level 0 gives (a mark says so)."""
        names: dict[str, None] = {}
        for run in self.runs:
            names.update(dict.fromkeys(run.inexact))
        return tuple(names)

    @property
    def fused_runs(self) -> tuple[SeedRun, ...]:
        """Counted runs trained in a fused group (`share_base: fused`): not bit-equal to a run of
        their own (the base ran over the group's larger batch); a mark says so."""
        return tuple(r for r in self.runs if r.fused is not None)

    @property
    def dropout_differs(self) -> bool:
        """Some run went through a rung that changes numerics with LoRA dropout on: its dropout
        masks were drawn for other micro-batches too."""
        return bool(self.inexact_rungs) and self.lora_dropout > 0

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
        return bool(_provenance_differs(self.runs))

    @property
    def repeated_seeds(self) -> dict[int, int]:
        """Seeds counted more than once (pooled only), with how many runs each."""
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


def choose_metric(task: str, rows: list[ResultRow], wanted: str | None = None) -> tuple[str, str | None]:
    """The metric a row shows and, when it is not the task's own, the note that says so. A
    `wanted` metric (`orch results --metric`) is shown whatever the runs reported."""
    if wanted is not None:
        split, _, bare = wanted.partition("_")
        reported = any(wanted in _reported(row) for row in rows)
        if split in ("val", "test") and bare and not reported and any(bare in _reported(row) for row in rows):
            # the table holds each split under the bare name (`loss`, val beside test)
            return wanted, (f"no run reported {wanted} among its test metrics: the table shows each split under "
                            f"the metric's bare name, --metric {bare} (val beside test)")
        return wanted, None
    # a metric reported as NaN was reported: the row shows it (each such run named), not another
    primary = primary_metric(task)
    if any(primary in _reported(row) for row in rows):
        return primary, None
    # A benchmark's task (`glue_mrpc`) has a metric a reader expects; a script's own task
    # (`toy`) shows what its runs report, and the metric column says which.
    named = _TASK.match(task.lower()) is not None
    if any(DEFAULT_METRIC in _reported(row) for row in rows):
        return DEFAULT_METRIC, f"no run reported {primary}: {DEFAULT_METRIC} shown" if named else None
    for row in rows:  # the first metric its runs report
        if names := _reported(row):
            first = names[0]
            return first, f"no run reported {primary}: {first} shown" if named else None
    return primary, None


def _reported(row: ResultRow) -> list[str]:
    """The test metrics a run reported: its finite ones, then those whose value was not finite."""
    return [*row.metrics, *(name for name in row.nonfinite if name not in row.metrics)]


def aggregate(rows: Iterable[ResultRow], metric: str | None = None, pooled: bool = False) -> list[ResultSummary]:
    """One summary per (suite, config, overrides, config content, task), in submission order.
    `metric` shows that metric in every row instead of the task's own; `pooled` counts every
    succeeded run instead of one per seed."""
    groups: dict[tuple[str, str, str, str, str], list[ResultRow]] = {}
    labels: dict[int, str] = {}  # rows of one job's setting share one overrides mapping
    firsts: dict[tuple[Any, ...], float] = {}  # the first job id of a suite, config, setting, task
    for row in rows:
        label = labels.get(id(row.overrides))
        if label is None:
            label = labels[id(row.overrides)] = overrides_label(row.overrides)
        groups.setdefault((row.suite, row.config, label, row.task, row.setting), []).append(row)
        job = float("inf") if row.job is None else row.job
        for key in (("suite", row.suite), ("config", row.suite, row.config),
                    ("setting", row.suite, row.config, label, row.setting), ("task", row.suite, row.task)):
            firsts[key] = min(firsts.get(key, job), job)
    # The same config and overrides run with different content, worker command or env: name the setting.
    contents: dict[tuple[str, str, str], set[str]] = {}
    for suite, config, label, _, setting in groups:
        contents.setdefault((suite, config, label), set()).add(setting)
    summaries = []
    for key, group in groups.items():
        suite, config, label, task, setting = key
        variant = f"setting {setting}" if len(contents[(suite, config, label)]) > 1 and setting else ""
        summary = _summarise(group, label, variant, metric, pooled)
        order = (firsts[("suite", suite)], natural_key(suite), firsts[("config", suite, config)], natural_key(config),
                 firsts[("setting", suite, config, label, setting)], natural_key(label), setting)
        task_order = (firsts[("task", suite, task)], natural_key(task))
        summaries.append(replace(summary, order=order, task_order=task_order))
    summaries.sort(key=lambda s: (s.order, s.task_order))
    return summaries


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """`r8` < `r16` < `r64`: the numbers in a name compare as numbers."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)


def _run(row: ResultRow, value: float | None, metric: str) -> SeedRun:
    return SeedRun(seed=row.seed, value=value, job=row.job, attempt=row.attempt, level=row.level, step=row.step,
                   changes=dict(row.changes), run_alone=row.run_alone, test_is_val=row.test_is_val,
                   val=row.val_metrics.get(metric), best_step=row.best_step, inexact=row.inexact,
                   diverged=row.diverged, code=row.code, libraries=row.libraries, level_note=row.level_note,
                   fused=row.fused)


def _provenance_differs(runs: tuple[SeedRun, ...] | list[SeedRun]) -> list[str]:
    """What the runs' provenance differs in: "code", "library versions" (unknown values aside)."""
    return [name for name, attr in (("code", "code"), ("library versions", "libraries"))
            if len({v for r in runs if (v := getattr(r, attr)) is not None}) > 1]


def _evidence_notes(counted: list[SeedRun]) -> list[str]:
    """The notes of a row's diverged runs, of runs whose job started above level 0, and of runs of
    different code or libraries."""
    notes = [f"{seed_text(r.seed, r.job)}: loss diverged, {r.diverged}: counted, marked" for r in counted if r.diverged]
    notes += [f"{seed_text(r.seed, r.job)}: {r.level_note}" for r in counted if r.level_note]
    differs = _provenance_differs(counted)
    if differs:
        notes.append(f"runs differ in {' and '.join(differs)} (`orch results --json` lists each run's)")
    return notes


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation; no std for fewer than two values (never `± 0`). A
    metric may be as large as wording.MAX_METRIC (1e300): spread.sample_std keeps its deviations'
    squares within a float's range."""
    if not values:
        return None, None
    mean = sum(values) / len(values)
    return mean, sample_std(values) if len(values) >= 2 else None


def _seed_input(row: ResultRow, metric: str) -> SeedRunInput:
    succeeded = row.state is JobState.SUCCEEDED
    why, nonfinite = row.reason, ""
    if succeeded and metric not in row.metrics:  # why, and the value it reported instead, if any
        why = missing_said(metric, row.nonfinite, row.no_metrics, bool(row.metrics))
        nonfinite = row.nonfinite.get(metric, "")
    return SeedRunInput(row.seed, row.job, row.state, succeeded and metric in row.metrics, why, nonfinite,
                        row.diverged or "")


def _summarise(rows: list[ResultRow], label: str, variant: str, wanted: str | None, pooled: bool) -> ResultSummary:
    first = rows[0]
    succeeded = [r for r in rows if r.state is JobState.SUCCEEDED]
    metric, fallback_note = choose_metric(first.task, succeeded, wanted)
    inputs = {id(r): _seed_input(r, metric) for r in rows}
    by_input = {id(inputs[id(r)]): r for r in rows}
    counted_rows = [by_input[id(i)] for i in counted_runs(list(inputs.values()), pooled)]
    counted = [_run(r, float(r.metrics[metric]), metric) for r in counted_rows]
    ordered = sorted(succeeded, key=lambda r: (r.seed, r.job if r.job is not None else -1))
    uncounted = [(r, _run(r, None, metric)) for r in ordered if metric not in r.metrics]
    mean, std = mean_std([r.value for r in counted if r.value is not None])
    val_only_rows = _val_only(rows, metric, pooled)
    val_only = [_run(r, None, metric) for r in val_only_rows]
    vals = [r.val for r in [*counted, *val_only] if r.val is not None]
    val_mean, val_std = mean_std(vals)
    states = seed_states(inputs.values())
    notes: list[str] = [fallback_note] if fallback_note else []
    notes += later_run_notes(list(inputs.values()), states, pooled, _jobs_text)
    notes += _evidence_notes(counted)
    notes += uncounted_notes([inputs[id(row)] for row, _ in uncounted], {r.seed: r.job for r in counted}, pooled)
    notes += _nonfinite_notes(counted_rows, val_only_rows, metric)
    notes += pruned_notes(states)  # with the step, value and rank early stopping judged
    for state in states:
        if state.status in (SeedStatus.FAILED, SeedStatus.CANCELLED):  # pruned: pruned_notes
            where = seed_text(state.seed, state.job)
            verb = "failed" if state.status is SeedStatus.FAILED else "was cancelled"
            notes.append(f"{where} {verb}, not counted" + (f": {state.why}" if state.why else ""))
    return ResultSummary(
        suite=first.suite, config=first.config, task=first.task, metric=metric, mean=mean, std=std,
        n=len(counted), seeds=tuple(r.seed for r in counted), runs=tuple(counted),
        overrides=dict(first.overrides), overrides_label=label, variant=variant, notes=tuple(notes),
        uncounted=tuple(run for _, run in uncounted), primary=primary_metric(first.task),
        lora_dropout=max(r.lora_dropout for r in rows), seed_states=tuple(states),
        denominator=denominator(states, len(rows)), pooled=pooled,
        unfinished=any(r.state in PENDING for r in rows),
        failed_runs=lost_runs(list(inputs.values()), states),
        val_mean=val_mean, val_std=val_std, val_n=len(vals), setting=first.setting, val_only=tuple(val_only),
    )  # fmt: skip


def _val_only(rows: list[ResultRow], metric: str, pooled: bool) -> list[ResultRow]:
    """Succeeded runs whose test value of `metric` was not finite and whose val is: their val
    counts. One per seed with no counted test value (its latest succeeded run, the one its
    denominator names), or every such run when pooled."""
    succeeded = sorted((r for r in rows if r.state is JobState.SUCCEEDED),
                       key=lambda r: (r.seed, r.job if r.job is not None else -1))
    if not pooled:
        counted_seeds = {r.seed for r in succeeded if metric in r.metrics}
        latest = {r.seed: r for r in succeeded if r.seed not in counted_seeds}  # job order: the last wins
        succeeded = list(latest.values())
    return [r for r in succeeded if metric not in r.metrics and metric in r.nonfinite and metric in r.val_metrics]


def _nonfinite_notes(counted: list[ResultRow], val_only: list[ResultRow], metric: str) -> list[str]:
    """A run whose val counts though its test value was not finite, and a counted run whose val
    of the metric was not finite (its val left out of the val mean)."""
    notes = [f"{seed_text(r.seed, r.job)}: its val {metric} counted in the val mean, though it reported "
             f"{nonfinite_said('test', metric, r.nonfinite[metric])}" for r in val_only]
    notes += [f"{seed_text(r.seed, r.job)}: {nonfinite_said('val', metric, r.val_nonfinite[metric])}: "
              "its val not counted" for r in counted if metric in r.val_nonfinite and metric not in r.val_metrics]
    return notes


def _jobs_text(jobs: list[int | None]) -> str:
    named = ", ".join(str(job) for job in jobs if job is not None)
    return f" (jobs {named})" if named else ""
