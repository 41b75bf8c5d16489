"""Results as text people paste: a terminal table's rows, CSV, and JSON records (Markdown and
LaTeX grids are in results.grids). Pure functions from ResultSummary lists to strings or dicts.

Every format names a row's `--set` overrides, and marks what a reader must know about a cell:
† its runs ran at different ladder levels (same effective batch); ‡ the same with LoRA dropout
on, whose draws differ at other micro-batch sizes; § its "test" metric was scored on the
validation set; ¶ a run's loss diverged; ‖ its runs ran different code or library versions; * see
its notes (metric fallback, a seed that ran twice, runs not counted, which run diverged).

Text from user code (names, overrides, metric keys) goes into CSV neutralised as OWASP advises:
a cell beginning with `=`, `+`, `-`, `@`, tab or carriage return gets a leading `'` and quotes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from orchestrator.results.aggregate import ResultSummary
from orchestrator.wording import fmt_changes

CSV_COLUMNS = ("suite", "config", "task", "metric", "mean", "std", "n_seeds", "seeds", "levels", "mixed_levels",
               "overrides", "test_is_val", "dropout_differs", "notes", "diverged", "mixed_provenance")
TABLE_COLUMNS = ("suite", "config", "overrides", "task", "metric", "mean ± std", "n", "seeds", "levels", "notes")
FORMATS = ("table", "csv", "markdown", "latex", "json")

MIXED, MIXED_DROPOUT, TEST_IS_VAL, SEE_NOTES = "†", "‡", "§", "*"
DIVERGED, MIXED_PROVENANCE = "¶", "‖"
LEGEND = {
    MIXED: "† runs ran at different ladder levels, all with the same effective batch "
           "(`orch results --json` lists each run's level and changes)",
    MIXED_DROPOUT: "‡ as †, with lora_dropout > 0: dropout draws differ at other micro-batch sizes "
                   "(statistically equal, not bit-equal)",
    TEST_IS_VAL: "§ test = validation set: the best epoch was picked on the same split",
    DIVERGED: "¶ a run's loss diverged: its last epoch ended above its first steps or k × its minimum (counted)",
    MIXED_PROVENANCE: "‖ runs ran different code (commit, uncommitted changes) or library versions",
    SEE_NOTES: "* see the notes below",
}
_CSV_DANGER = ("=", "+", "-", "@", "\t", "\r")


def _exact(value: float) -> float:
    """A float without representation noise (0.8287999999999999 -> 0.8288), for machines."""
    return round(value, 10)


def score(summary: ResultSummary, digits: int) -> str:
    if summary.mean is None:
        return "—"
    return f"{summary.mean:.{digits}f} ± {summary.std:.{digits}f}"


def cell_marks(summary: ResultSummary, with_notes: bool = True) -> list[str]:
    """The marks a cell carries, in legend order."""
    marks = []
    if summary.mixed_levels:
        marks.append(MIXED_DROPOUT if summary.dropout_differs else MIXED)
    if summary.test_is_val:
        marks.append(TEST_IS_VAL)
    if summary.diverged:
        marks.append(DIVERGED)
    if summary.mixed_provenance:
        marks.append(MIXED_PROVENANCE)
    if with_notes and summary.notes:
        marks.append(SEE_NOTES)
    return marks


def legend_lines(summaries: Iterable[ResultSummary], with_notes: bool = True) -> list[str]:
    """One line per mark used, in legend order."""
    used = {mark for s in summaries for mark in cell_marks(s, with_notes)}
    return [text for mark, text in LEGEND.items() if mark in used]


def seeds_text(summary: ResultSummary) -> str:
    """`1 2 3`; a seed that ran twice reads `1×2`."""
    counts: dict[int, int] = {}
    for seed in summary.seeds:
        counts[seed] = counts.get(seed, 0) + 1
    return " ".join(str(seed) if times == 1 else f"{seed}×{times}" for seed, times in counts.items())


def render_rows(summaries: Iterable[ResultSummary], digits: int = 4) -> list[list[str]]:
    """Plain string rows (no header, TABLE_COLUMNS) for a terminal table."""
    rows = []
    for s in summaries:
        shown = " ".join([score(s, digits), *(m for m in cell_marks(s, with_notes=False) if m not in (MIXED, MIXED_DROPOUT))])
        levels = ",".join(map(str, s.levels))
        if s.mixed_levels:
            levels += f" {MIXED_DROPOUT if s.dropout_differs else MIXED}"
        rows.append([s.suite, s.config, s.overrides_label or s.variant or "-", s.task, s.metric, shown, str(s.n),
                     seeds_text(s), levels, "; ".join(s.notes)])
    return rows


def csv_cell(text: str) -> str:
    """A CSV field for text from user code: a leading `=`, `+`, `-`, `@`, tab or CR would make
    a spreadsheet run it, so such a cell starts with `'` and is quoted (OWASP)."""
    if text[:1] in _CSV_DANGER and text:
        return '"' + ("'" + text).replace('"', '""') + '"'
    if any(ch in text for ch in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def csv_lines(header: Sequence[str], rows: Iterable[Sequence[str | int | float]]) -> str:
    """CSV text: str cells through csv_cell, numbers as Python writes them (repr)."""
    lines = [",".join(csv_cell(name) for name in header)]
    for row in rows:
        lines.append(",".join(csv_cell(c) if isinstance(c, str) else repr(c) for c in row))
    return "\n".join(lines) + "\n"


def to_csv(summaries: Iterable[ResultSummary]) -> str:
    """CSV with a header row (CSV_COLUMNS): one line per effective config × task; seeds (one per
    run counted) and levels space-separated; empty mean when missing; notes joined by `; `."""
    rows: list[list[str | int | float]] = []
    for s in summaries:
        rows.append([
            s.suite, s.config, s.task, s.metric, "" if s.mean is None else _exact(s.mean), _exact(s.std), s.n,
            " ".join(map(str, s.seeds)), " ".join(map(str, s.levels)), _flag(s.mixed_levels),
            s.overrides_label if not s.variant else ", ".join(filter(None, (s.overrides_label, s.variant))),
            _flag(s.test_is_val), _flag(s.dropout_differs), "; ".join(s.notes), len(s.diverged),
            _flag(s.mixed_provenance),
        ])  # fmt: skip
    return csv_lines(CSV_COLUMNS, rows)


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _run_record(r: Any) -> dict[str, Any]:
    return {"seed": r.seed, "value": None if r.value is None else _exact(r.value), "job": r.job,
            "attempt": r.attempt, "level": r.level, "step": r.step, "changes": dict(r.changes),
            "run_alone": r.run_alone, "changed": fmt_changes(dict(r.changes), r.run_alone) or "nothing",
            "test_is_val": r.test_is_val, "diverged": r.diverged, "code": r.code, "libraries": r.libraries}


def to_records(summaries: Iterable[ResultSummary]) -> list[dict[str, Any]]:
    """The `--json` shape: one record per effective config × task, with every run counted traced
    to its job, attempt, ladder level and what that level changed (and the runs not counted)."""
    records = []
    for s in summaries:
        records.append({
            "suite": s.suite, "config": s.config, "overrides": dict(s.overrides),
            "overrides_label": s.overrides_label, "variant": s.variant, "task": s.task,
            "metric": s.metric, "primary_metric": s.primary,
            "mean": None if s.mean is None else _exact(s.mean), "std": _exact(s.std),
            "n": s.n, "n_seeds": s.n, "seeds": list(s.seeds),
            "repeated_seeds": {str(k): v for k, v in s.repeated_seeds.items()},
            "levels": list(s.levels), "mixed_levels": s.mixed_levels,
            "lora_dropout": s.lora_dropout, "dropout_differs": s.dropout_differs, "test_is_val": s.test_is_val,
            "marks": cell_marks(s), "notes": list(s.notes), "diverged": len(s.diverged),
            "mixed_provenance": s.mixed_provenance,
            "provenance": {name: sorted({v for r in s.runs if (v := getattr(r, name)) is not None})
                           for name in ("code", "libraries")},
            "runs": [_run_record(r) for r in s.runs], "uncounted": [_run_record(r) for r in s.uncounted],
        })  # fmt: skip
    return records
