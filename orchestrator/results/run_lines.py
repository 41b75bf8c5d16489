"""The accounted table per run: one line per setting × task × seed run × split × metric, with the
run's state, whether its row counts it and why (not), and its marks. Pure: no I/O.

A line is `counted` when its run is the one value its seed gives the row for that metric (the
latest succeeded run of the seed that reported it, results.seeds; every such run when pooled),
so the mean of a row's counted test lines is the row's mean in every other view. A failed,
cancelled, queued or running job is one line without a value, on its row's metric.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.attempts.reported import missing_said
from orchestrator.lifecycle import JobState
from orchestrator.results.aggregate import ResultRow, ResultSummary, overrides_label
from orchestrator.results.formats import (
    DIVERGED,
    FAILED_RUNS,
    FUSED,
    INEXACT,
    PRUNED,
    TEST_IS_VAL,
    UNFINISHED,
    cell_marks,
)
from orchestrator.results.seeds import SeedRunInput, counted_runs

# What a job's state reads as in a line. A new terminal state is one entry here (and a mark in
# STATE_MARKS if the table must flag it; its seeds' status is results.seeds._BY_STATE); a state
# missing here reads as its own value.
STATE_WORDS: dict[str, str] = {
    JobState.SUCCEEDED.value: "succeeded",
    JobState.FAILED.value: "failed",
    JobState.CANCELLED.value: "cancelled",
    JobState.RUNNING.value: "running",
    JobState.QUEUED.value: "queued",
    JobState.PRUNED.value: "pruned",
}
STATE_MARKS: dict[str, str] = {
    JobState.FAILED.value: FAILED_RUNS,
    JobState.CANCELLED.value: FAILED_RUNS,
    JobState.PRUNED.value: PRUNED,
    JobState.RUNNING.value: UNFINISHED,
    JobState.QUEUED.value: UNFINISHED,
}

Key = tuple[str, str, str, str, str]


@dataclass(frozen=True)
class RunLine:
    """One run's value of one metric on one split, as its row accounts for it."""

    job: int | None
    suite: str
    config: str
    overrides: Mapping[str, Any]
    setting: str  # the row's overrides as text (`learning_rate=0.001`), "" without
    task: str
    seed: int
    attempt: int | None
    state: str  # STATE_WORDS
    counted: bool
    split: str  # "test" or "val"
    metric: str
    value: float | None
    level: int | None
    inexact_rungs: tuple[str, ...]
    marks: tuple[str, ...]  # the run's own marks (†, ⊕, §, ♯, ¶, ◇)
    why: str  # the reasons: of each mark, and why it is not counted
    best_step: int | None = None
    row_marks: tuple[str, ...] = ()  # its row's marks in the tables, on the row's metric
    row_metric: bool = False  # the metric its row shows (the others are reported beside it)


def _key(suite: str, config: str, label: str, task: str, setting: str) -> Key:
    return (suite, config, label, task, setting)


def run_lines(rows: Sequence[ResultRow], summaries: Sequence[ResultSummary]) -> list[RunLine]:
    """Every job of every summary, by summary (suite order), then seed and job."""
    groups: dict[Key, list[ResultRow]] = {}
    for row in rows:
        key = _key(row.suite, row.config, overrides_label(row.overrides), row.task, row.setting)
        groups.setdefault(key, []).append(row)
    lines: list[RunLine] = []
    for s in summaries:
        group = groups.get(_key(s.suite, s.config, s.overrides_label, s.task, s.setting), [])
        lines += _group_lines(
            s, sorted(group, key=lambda r: (r.seed, -1 if r.job is None else r.job))
        )
    return lines


def _counted_jobs(group: Sequence[ResultRow], metric: str, pooled: bool) -> set[int]:
    """The jobs whose value of `metric` the row would count (results.seeds' rule)."""
    inputs = [SeedRunInput(r.seed, r.job, r.state, r.state is JobState.SUCCEEDED and metric in r.metrics)
              for r in group]  # fmt: skip
    return {run.job for run in counted_runs(inputs, pooled) if run.job is not None}


def _group_lines(s: ResultSummary, group: list[ResultRow]) -> list[RunLine]:
    label = s.overrides_label
    row_marks = tuple(cell_marks(s))
    metrics = list(dict.fromkeys([s.metric, *(k for r in group for k in r.metrics)]))
    counted = {m: _counted_jobs(group, m, s.pooled) for m in metrics}
    counted[s.metric] = {r.job for r in s.runs if r.job is not None}  # the row's own choice
    val_only = {r.job for r in s.val_only if r.job is not None}  # its val counts, its test was not finite
    lines = []
    for r in group:
        base: dict[str, Any] = dict(
            job=r.job, suite=r.suite, config=r.config, overrides=r.overrides, setting=label,
            task=r.task, seed=r.seed, attempt=r.attempt, state=STATE_WORDS.get(_value(r.state), _value(r.state)),
            level=r.level, inexact_rungs=r.inexact, best_step=r.best_step,
        )  # fmt: skip
        if r.state is not JobState.SUCCEEDED:
            mark = STATE_MARKS.get(_value(r.state))
            said = r.reason if r.reason and r.reason.startswith(base["state"]) else (
                f"{base['state']}" + (f": {r.reason}" if r.reason else ""))  # "pruned at step 4 ..."
            lost = said + ", not counted"
            lines.append(
                RunLine(
                    **base,
                    counted=False,
                    split="test",
                    metric=s.metric,
                    value=None,
                    marks=(mark,) if mark else (),
                    why=lost,
                    row_marks=row_marks,
                    row_metric=True,
                )
            )
            continue
        own, reasons = _run_marks(r)
        for metric in (m for m in metrics if m in r.metrics or m == s.metric):
            is_counted = r.job in counted[metric]
            why: list[str] = list(reasons)
            missing = "" if metric in r.metrics else missing_said(metric, r.nonfinite, r.no_metrics, bool(r.metrics))
            if missing:
                why.append(f"reported {missing}, not counted")
            elif not is_counted:
                later = [o.job for o in group if o.seed == r.seed and o.job in counted[metric]]
                why.append(
                    f"seed {r.seed} ran again: job {later[-1]} counted" if later else "not counted"
                )
            extra: dict[str, Any] = dict(
                row_marks=row_marks if metric == s.metric else (), row_metric=metric == s.metric
            )
            lines.append(
                RunLine(
                    **base,
                    counted=is_counted,
                    split="test",
                    metric=metric,
                    value=r.metrics.get(metric),
                    marks=own,
                    why="; ".join(why),
                    **extra,
                )
            )
            if metric in r.val_metrics:
                val_counted = metric == s.metric and r.job in val_only
                val_why = [*reasons, f"reported {missing}: its val counted"]  # a non-finite test value
                lines.append(
                    RunLine(
                        **base,
                        counted=is_counted or val_counted,
                        split="val",
                        metric=metric,
                        value=r.val_metrics[metric],
                        marks=own,
                        why="; ".join(val_why if val_counted else why),
                        **extra,
                    )
                )
    return lines


def _value(state: JobState | str) -> str:
    """A state's value (a state the lifecycle added later may reach here as its text)."""
    return state.value if isinstance(state, JobState) else str(state)


def _run_marks(r: ResultRow) -> tuple[tuple[str, ...], list[str]]:
    """A succeeded run's own marks and their reasons."""
    marks: list[str] = []
    reasons: list[str] = []
    if r.inexact:
        marks.append(INEXACT)
        reasons.append(f"went through rungs that change numerics: {', '.join(r.inexact)}")
    if r.fused is not None:
        marks.append(FUSED)
        if r.fused == 1:  # no batch-mate: the fused code path alone, as the legend says
            reasons.append("trained alone in a fused process (share_base: fused): the fused code path, "
                           "not shown bit-equal to a run of its own")
        else:
            group = f"a group of up to {r.fused} members" if r.fused else "a group"
            reasons.append(f"trained in {group} in one fused process (share_base: fused): "
                           "not bit-equal to a run of its own")
    if r.test_is_val:
        marks.append(TEST_IS_VAL)
        reasons.append("its test metrics were scored on the validation split")
    if r.diverged:
        marks.append(DIVERGED)
        reasons.append(f"loss diverged: {r.diverged}")
    return tuple(marks), reasons
