"""Results as text people paste: a terminal table's rows, CSV, and JSON records (Markdown and
LaTeX grids are in results.grids). Pure functions from ResultSummary lists to strings or dicts.

Every format names a row's `--set` overrides and its denominator (n of the seeds submitted, and
what became of the others), and marks what a reader must know about a cell: † some run of it went
through a ladder rung that changes numerics (half batch × double accumulation, a suite rung not
declared exact), whatever its precision and dropout: the legend names the rungs, and its value is
an equivalent draw, not the number level 0 gives (exact rungs are not marked: they give bit-equal
numbers in bf16; in fp32 `logits_to_keep` moves values in their last bits, docs/ladder.md); § its
"test" metric was scored on the validation set; ¶ some of its seeds failed, were cancelled or
reported no metric (the mean is over the survivors); ◇ some of its runs are still queued or running;
‡ early stopping pruned its setting; ♯ a counted run's loss diverged; ‖ its runs ran different code
or library versions; ⊕ some run trained in a fused group (`share_base: fused`), not bit-equal to a
run of its own; * see its notes. A std of fewer than two values is `—`, never `± 0`.

Text from user code (names, overrides, metric keys) goes into CSV neutralised as OWASP advises:
a cell beginning with `=`, `+`, `-`, `@`, tab or carriage return gets a leading `'` and quotes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from orchestrator.results.aggregate import ResultSummary
from orchestrator.wording import fmt_changes

CSV_COLUMNS = ("suite", "config", "task", "metric", "mean", "std", "n_seeds", "seeds", "levels", "mixed_levels",
               "overrides", "test_is_val", "dropout_differs", "notes", "val_mean", "val_std", "val_n", "best_steps",
               "submitted", "failed", "cancelled", "running", "queued", "no_metric", "accounted", "pooled", "chosen_by",
               "inexact_rungs", "run_levels", "run_inexact_rungs", "diverged", "mixed_provenance", "pruned",
               "fused_runs")
TABLE_COLUMNS = ("suite", "config", "overrides", "task", "metric", "mean ± std", "val", "n", "seeds", "levels",
                 "notes")
FORMATS = ("table", "csv", "markdown", "latex", "json")

INEXACT, TEST_IS_VAL, FAILED_RUNS, UNFINISHED, SEE_NOTES = "†", "§", "¶", "◇", "*"
DIVERGED, MIXED_PROVENANCE, PRUNED, FUSED = "♯", "‖", "‡", "⊕"
# One legend for every mark of every format, in the order cells carry them (for papers: no CLI text).
LEGEND = {
    INEXACT: "† some runs went through a ladder rung that changes numerics ({rungs}): their values are "
             "equivalent draws, not the numbers level 0 gives (exact rungs are not marked: bit-equal in "
             "bf16; in fp32 `logits_to_keep` moves values by ≤ 4.3e-7 relative, same scores)",
    FUSED: "⊕ some runs trained in a fused group (share_base: fused; {fused}): {fused_why}",
    TEST_IS_VAL: "§ test = validation set: the best epoch was picked on the same split",
    FAILED_RUNS: "¶ some seeds failed, were cancelled or reported no metric: the mean is over the seeds "
                 "that succeeded (n of the seeds submitted), which may be biased",
    UNFINISHED: "◇ some runs are still queued or running: the row may change",
    PRUNED: "‡ early stopping stopped the setting: its seeds are kept out of the mean (the notes say at which "
            "step, its value and rank there)",
    DIVERGED: "♯ a run's loss diverged: its last epoch ended above its first steps or k × its minimum (counted)",
    MIXED_PROVENANCE: "‖ runs ran different code (commit, uncommitted changes) or library versions",
    SEE_NOTES: "* see the notes below",
}
# What every table's numbers are, said under each (the std's divisor, what val is).
SCORE_LINE = ("mean ± std over seeds: std is the sample standard deviation (n − 1), — for one seed; val: "
              "the mean, over the runs that report it (val_n), of each run's best evaluation on the validation split")
HINTS = {INEXACT: "`orch results --json` lists each run's level and rungs"}  # the terminal's legend only
POOLED_LINE = "pooled: every succeeded run counted (a rerun of a seed counts again), n = runs, not seeds"
_CSV_DANGER = ("=", "+", "-", "@", "\t", "\r")


def column_title(task: str, metric: str) -> str:
    """`rte (accuracy)`; the metric alone for a script without tasks (no ` (accuracy)`)."""
    return f"{task} ({metric})" if task else metric


def score_line(with_val: bool, pooled: bool = False) -> str:
    """SCORE_LINE, its `val:` part only where the table has a val column; over runs, not seeds,
    where the table pools reruns (`--pooled`)."""
    line = SCORE_LINE if with_val else SCORE_LINE.split("; val:", 1)[0]
    return line.replace("over seeds", "over runs", 1).replace("for one seed", "for one run", 1) if pooled else line


def _exact(value: float) -> float:
    """A float without representation noise (0.8287999999999999 -> 0.8288), for machines."""
    return round(value, 10)


def mean_pm_std(mean: float | None, std: float | None, digits: int, pm: str = "±", none: str = "—") -> str:
    """`0.6200 ± 0.0500`; `0.6200 ± —` for a single value; `—` for none."""
    if mean is None:
        return none
    return f"{mean:.{digits}f} {pm} " + (none if std is None else f"{std:.{digits}f}")


def score(summary: ResultSummary, digits: int) -> str:
    return mean_pm_std(summary.mean, summary.std, digits)


def val_score(summary: ResultSummary, digits: int) -> str:
    return mean_pm_std(summary.val_mean, summary.val_std, digits) if summary.val_n else ""


def cell_marks(summary: ResultSummary, with_notes: bool = True) -> list[str]:
    """The marks a cell carries, in legend order."""
    marks = []
    if summary.inexact_rungs:
        marks.append(INEXACT)
    if summary.fused_runs:
        marks.append(FUSED)
    if summary.test_is_val:
        marks.append(TEST_IS_VAL)
    marks += accounting_marks(summary)
    marks += evidence_marks(summary)
    if with_notes and summary.notes:
        marks.append(SEE_NOTES)
    return marks


def accounting_marks(summary: ResultSummary) -> list[str]:
    """¶ when seeds are missing for good, ◇ while runs are still going, ‡ when seeds were pruned."""
    return [mark for mark, on in ((FAILED_RUNS, summary.failed_runs), (UNFINISHED, summary.unfinished),
                                  (PRUNED, summary.denominator.pruned > 0)) if on]


def evidence_marks(summary: ResultSummary) -> list[str]:
    """♯ when a counted run diverged, ‖ when the runs ran different code or libraries."""
    return [
        mark
        for mark, on in (
            (DIVERGED, bool(summary.diverged)),
            (MIXED_PROVENANCE, summary.mixed_provenance),
        )
        if on
    ]


def legend_lines(summaries: Iterable[ResultSummary], with_notes: bool = True, hints: bool = False,
                 escape: Callable[[str], str] = str) -> list[str]:  # fmt: skip
    """One line per mark used, in legend order, † naming the rungs (suite text: `escape`d for the
    format); `hints` adds where to look (the terminal only)."""
    summaries = list(summaries)
    used = {mark for s in summaries for mark in cell_marks(s, with_notes)}
    rungs = ", ".join(escape(rung) for rung in dict.fromkeys(r for s in summaries for r in s.inexact_rungs))
    largest = max((r.fused or 0 for s in summaries for r in s.fused_runs), default=0)
    fused = f"groups of up to {largest} members" if largest else "group size not reported"
    if largest > 1 and any(r.fused == 1 for s in summaries for r in s.fused_runs):
        fused += ", some runs alone in theirs"  # the larger batch below is not theirs
    fused_why = "not bit-equal to a run of their own, the base ran over the group's larger batch"
    if largest == 1:  # no batch-mate, no larger batch: the fused code path alone, not shown equal either
        fused = "each alone in its group"
        fused_why = "trained by the fused code path, not shown bit-equal to a run of its own"
    return [text.format(rungs=rungs, fused=fused, fused_why=fused_why)
            + (f" ({HINTS[mark]})" if hints and mark in HINTS else "")
            for mark, text in LEGEND.items() if mark in used]


def table_lines(summaries: Sequence[ResultSummary]) -> list[str]:
    """Lines about the whole table: pooled runs, runs still going."""
    lines = [POOLED_LINE] if any(s.pooled for s in summaries) else []
    going = sum(s.denominator.running + s.denominator.queued for s in summaries)
    if any(s.unfinished for s in summaries):
        lines.append(f"partial: {going} seed(s) not finished yet (◇ rows may change)" if going
                     else "partial: reruns still queued or running (◇ rows may change)")
    return lines


def seeds_text(summary: ResultSummary) -> str:
    """`1 2 3`; a seed counted twice (pooled) reads `1×2`."""
    counts: dict[int, int] = {}
    for seed in summary.seeds:
        counts[seed] = counts.get(seed, 0) + 1
    return " ".join(str(seed) if times == 1 else f"{seed}×{times}" for seed, times in counts.items())


def render_rows(summaries: Iterable[ResultSummary], digits: int = 4) -> list[list[str]]:
    """Plain string rows (no header, TABLE_COLUMNS) for a terminal table."""
    rows = []
    for s in summaries:
        shown = score(s, digits) + "".join(f" {mark}" for mark in cell_marks(s, with_notes=False))
        levels = ",".join(map(str, s.levels))
        if s.inexact_rungs:
            levels += f" {INEXACT}"
        rows.append([s.suite, s.config, s.overrides_label or s.variant or "-", s.task, s.metric, shown,
                     val_score(s, digits), s.n_text, seeds_text(s), levels, "; ".join(s.notes)])
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


def to_csv(summaries: Iterable[ResultSummary], chosen: Mapping[int, str] | None = None) -> str:
    """CSV with a header row (CSV_COLUMNS): one line per effective config × task; seeds (one per
    value counted), levels and best steps space-separated; empty mean and std when missing (a
    std needs two values); notes joined by `; `; `chosen_by` says `val` or `test` on the rows a
    table bolds (`chosen`: id of a summary -> basis)."""
    rows: list[list[str | int | float]] = []
    for s in summaries:
        d = s.denominator
        rows.append([
            s.suite, s.config, s.task, s.metric, _opt(s.mean), _opt(s.std), s.n,
            " ".join(map(str, s.seeds)), " ".join(map(str, s.levels)), _flag(s.mixed_levels),
            s.overrides_label if not s.variant else ", ".join(filter(None, (s.overrides_label, s.variant))),
            _flag(s.test_is_val), _flag(s.dropout_differs), "; ".join(s.notes),
            _opt(s.val_mean), _opt(s.val_std), s.val_n,
            " ".join(str(r.best_step) for r in s.runs if r.best_step is not None),
            d.submitted, d.failed, d.cancelled, d.running, d.queued, d.no_metric, s.accounted, _flag(s.pooled),
            (chosen or {}).get(id(s), ""), "; ".join(s.inexact_rungs), " ".join(_level(r) for r in s.runs),
            "; ".join(f"{r.seed}:{'+'.join(r.inexact) or '-'}" for r in s.runs), len(s.diverged),
            _flag(s.mixed_provenance), d.pruned, len(s.fused_runs),
        ])  # fmt: skip
    return csv_lines(CSV_COLUMNS, rows)


def _level(run: Any) -> str:
    return "?" if run.level is None else str(run.level)


def _opt(value: float | None) -> str | float:
    return "" if value is None else _exact(value)


def _opt_json(value: float | None) -> float | None:
    return None if value is None else _exact(value)


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _run_record(r: Any) -> dict[str, Any]:
    return {"seed": r.seed, "value": None if r.value is None else _exact(r.value), "job": r.job,
            "attempt": r.attempt, "level": r.level, "step": r.step, "changes": dict(r.changes),
            "run_alone": r.run_alone, "changed": fmt_changes(dict(r.changes), r.run_alone) or "nothing",
            "test_is_val": r.test_is_val, "val": _opt_json(r.val), "best_step": r.best_step,
            "inexact_rungs": list(r.inexact), "diverged": r.diverged, "code": r.code,
            "libraries": r.libraries, "fused_members": r.fused}


def to_records(summaries: Iterable[ResultSummary], chosen: Mapping[int, str] | None = None) -> list[dict[str, Any]]:
    """The `--json` shape: one record per effective config × task, with every run counted traced
    to its job, attempt, ladder level and what that level changed (and the runs not counted),
    every submitted seed's status, the val mean beside the test mean, and `chosen_by` (`val`,
    `test` or null: what made this row its column's choice)."""
    records = []
    for s in summaries:
        records.append({
            "suite": s.suite, "config": s.config, "overrides": dict(s.overrides),
            "overrides_label": s.overrides_label, "variant": s.variant, "task": s.task,
            "metric": s.metric, "primary_metric": s.primary,
            "mean": _opt_json(s.mean), "std": _opt_json(s.std),
            "val_mean": _opt_json(s.val_mean), "val_std": _opt_json(s.val_std), "val_n": s.val_n,
            "n": s.n, "n_seeds": s.n, "seeds": list(s.seeds), "pooled": s.pooled,
            "denominator": s.denominator.as_dict(), "accounted": s.accounted, "n_text": s.n_text,
            "seed_states": [{"seed": st.seed, "status": st.status.value, "job": st.job, "why": st.why}
                            for st in s.seed_states],
            "unfinished": s.unfinished, "failed_runs": s.failed_runs,
            "repeated_seeds": {str(k): v for k, v in s.repeated_seeds.items()},
            "levels": list(s.levels), "mixed_levels": s.mixed_levels,
            "lora_dropout": s.lora_dropout, "dropout_differs": s.dropout_differs, "test_is_val": s.test_is_val,
            "inexact_rungs": list(s.inexact_rungs),
            "marks": cell_marks(s), "notes": list(s.notes), "chosen_by": (chosen or {}).get(id(s)),
            "diverged": len(s.diverged), "mixed_provenance": s.mixed_provenance, "fused_runs": len(s.fused_runs),
            "provenance": {name: sorted({v for r in s.runs if (v := getattr(r, name)) is not None})
                           for name in ("code", "libraries")},
            "runs": [_run_record(r) for r in s.runs], "uncounted": [_run_record(r) for r in s.uncounted],
        })  # fmt: skip
    return records
