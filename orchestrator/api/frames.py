"""The rows `Sweep` returns, built from the accounted results table (results.table) and the job
lists: every reader names the job `job`, carries one typed column per `--set` override key
(`learning_rate` a float, not text) and keeps `gpu` an integer. Pure: values in, rows out."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from orchestrator.lifecycle import JobState
from orchestrator.results.run_lines import RunLine
from orchestrator.store.rows import Job

RESULT_COLUMNS = (
    "job",
    "suite",
    "config",
    "setting",
    "task",
    "seed",
    "attempt",
    "state",
    "counted",
    "split",
    "metric",
    "value",
    "level",
    "inexact_rungs",
    "marks",
    "why",
    "row_marks",
    "best_step",
)
SUMMARY_COLUMNS = (
    "suite",
    "config",
    "setting",
    "task",
    "metric",
    "mean",
    "std",
    "val_mean",
    "val_std",
    "n",
    "n_text",
    "accounted",
    "marks",
    "notes",
    "chosen_by",
    "seeds",
    "inexact_rungs",
    "pooled",
)
# nullable integers (pandas `Int64`)
INT_COLUMNS = ("gpu", "level", "attempt", "best_step", "job", "pruned_step", "value_attempt")


def pruned_step(job: Job) -> int | float | None:
    """The step early stopping stopped a pruned job at (its prune record's); None for any other."""
    step = (job.pruned or {}).get("step") if job.state is JobState.PRUNED else None
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
        return None
    return int(step) if step == int(step) else float(step)


def override_columns(
    overrides: Iterable[Mapping[str, Any]], taken: Sequence[str]
) -> dict[str, str]:
    """Override key -> its column name, keys sorted: the key itself, or `set.KEY` where the
    key is already a column of the frame (a suite may call a config key `task`)."""
    keys = sorted({key for mapping in overrides for key in mapping})
    return {key: f"set.{key}" if key in taken else key for key in keys}


def with_overrides(
    row: dict[str, Any], overrides: Mapping[str, Any], columns: Mapping[str, str]
) -> dict[str, Any]:
    """The row with one column per override key: its value as the job ran with it, None where
    its job had no such override."""
    return {**row, **{name: overrides.get(key) for key, name in columns.items()}}


def column_order(fixed: Sequence[str], columns: Mapping[str, str]) -> list[str]:
    """The fixed columns with the override columns after `config`."""
    at = list(fixed).index("config") + 1 if "config" in fixed else len(fixed)
    return [*fixed[:at], *columns.values(), *fixed[at:]]


def result_rows(lines: Sequence[RunLine]) -> tuple[list[dict[str, Any]], list[str]]:
    """`Sweep.results()`: a row per setting × task × seed run × split × metric, and the
    columns in order."""
    columns = override_columns((line.overrides for line in lines), RESULT_COLUMNS)
    rows = []
    for line in lines:
        row = {
            "job": line.job,
            "suite": line.suite,
            "config": line.config,
            "setting": line.setting,
            "task": line.task,
            "seed": line.seed,
            "attempt": line.attempt,
            "state": line.state,
            "counted": line.counted,
            "split": line.split,
            "metric": line.metric,
            "value": line.value,
            "level": line.level,
            "inexact_rungs": "; ".join(line.inexact_rungs),
            "marks": " ".join(line.marks),
            "why": line.why,
            "row_marks": " ".join(line.row_marks),
            "best_step": line.best_step,
        }
        rows.append(with_overrides(row, line.overrides, columns))
    return rows, column_order(RESULT_COLUMNS, columns)


def summary_rows(records: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """`Sweep.summary()`: the records of `orch results --json` (every key kept), with `setting`
    (the overrides as text) and a typed column per override key; the columns in order (the
    summary columns first, then the rest of each record)."""
    columns = override_columns((r["overrides"] for r in records), SUMMARY_COLUMNS)
    rows = []
    for record in records:
        row = {**record, "setting": record["overrides_label"]}
        rows.append(with_overrides(row, record["overrides"], columns))
    ordered = column_order(SUMMARY_COLUMNS, columns)
    rest = [key for key in (records[0] if records else {}) if key not in ordered]
    return rows, ordered + rest


def typed_frame(rows: list[dict[str, Any]], columns: Sequence[str]) -> Any:
    """A DataFrame whose integer columns stay integers where values are missing (`Int64`)."""
    import pandas as pd

    frame = pd.DataFrame(rows, columns=list(columns))
    for name in INT_COLUMNS:
        if name in frame.columns:
            frame[name] = frame[name].astype("Int64")
    return frame
