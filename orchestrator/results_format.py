"""Results as text people paste: a terminal table's rows, CSV, Markdown, LaTeX, and JSON records.

Pure functions from ResultSummary lists to strings or plain dicts, for every command or page
that shows results. Markdown and LaTeX lay out configs × tasks (mean ± std over seeds), bold
the best mean of each task, and mark (†) a cell whose seeds ran at different ladder levels.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any

from orchestrator.results import ResultSummary
from orchestrator.wording import fmt_changes

CSV_COLUMNS = ("suite", "config", "task", "metric", "mean", "std", "n_seeds", "seeds", "levels", "mixed_levels")
FORMATS = ("table", "csv", "markdown", "latex", "json")
DAGGER_NOTE = "† seeds ran at different ladder levels (`orch results --json` lists each seed's level and changes)"


def _exact(value: float) -> float:
    """A float without representation noise (0.8287999999999999 -> 0.8288), for machines."""
    return round(value, 10)


def _score(summary: ResultSummary, digits: int) -> str:
    if summary.mean is None:
        return "—"
    return f"{summary.mean:.{digits}f} ± {summary.std:.{digits}f}"


def _levels_text(summary: ResultSummary) -> str:
    return ",".join(map(str, summary.levels)) + (" †" if summary.mixed_levels else "")


def render_rows(summaries: Iterable[ResultSummary], digits: int = 4) -> list[list[str]]:
    """Plain string rows (no header) for a terminal table: suite, config, task, metric,
    mean ± std, n, seeds, and the ladder levels the seeds ran at when known."""
    rows = []
    for s in summaries:
        seeds = " ".join(str(seed) for seed in s.seeds)
        row = [s.suite, s.config, s.task, s.metric, _score(s, digits), str(s.n_seeds), seeds]
        if s.levels:
            row.append(_levels_text(s))
        rows.append(row)
    return rows


def to_csv(summaries: Iterable[ResultSummary]) -> str:
    """CSV with a header row (CSV_COLUMNS); seeds and levels space-separated; empty mean when missing."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for s in summaries:
        mean = "" if s.mean is None else repr(_exact(s.mean))
        seeds = " ".join(str(seed) for seed in s.seeds)
        levels = " ".join(map(str, s.levels))
        writer.writerow([s.suite, s.config, s.task, s.metric, mean, repr(_exact(s.std)), s.n_seeds, seeds,
                         levels, "true" if s.mixed_levels else "false"])
    return buffer.getvalue()


def to_records(summaries: Iterable[ResultSummary]) -> list[dict[str, Any]]:
    """The `--json` shape: one record per cell, with every seed traced to its job, attempt,
    ladder level and what that level changed."""
    records = []
    for s in summaries:
        records.append({
            "suite": s.suite, "config": s.config, "task": s.task, "metric": s.metric,
            "mean": None if s.mean is None else _exact(s.mean), "std": _exact(s.std),
            "n_seeds": s.n_seeds, "seeds": list(s.seeds), "mixed_levels": s.mixed_levels,
            "runs": [
                {"seed": r.seed, "value": None if r.value is None else _exact(r.value), "job": r.job,
                 "attempt": r.attempt, "level": r.level, "step": r.step, "changes": dict(r.changes),
                 "run_alone": r.run_alone, "changed": fmt_changes(dict(r.changes), r.run_alone) or "nothing"}
                for r in s.runs
            ],
        })  # fmt: skip
    return records


# ---------------------------------------------------------------- configs × tasks grids


def _grid(summaries: Sequence[ResultSummary]) -> tuple[list[str], list[tuple[str, str]], dict[tuple[str, str], ResultSummary]]:
    """Row labels (configs, with the suite when several), column keys (task, metric), cells."""
    several_suites = len({s.suite for s in summaries}) > 1
    rows: list[str] = []
    columns: list[tuple[str, str]] = []
    cells: dict[tuple[str, str], ResultSummary] = {}
    for s in summaries:
        label = f"{s.suite}/{s.config}" if several_suites else s.config
        if label not in rows:
            rows.append(label)
        if (s.task, s.metric) not in columns:
            columns.append((s.task, s.metric))
        cells[(label, s.task)] = s
    columns.sort()
    return rows, columns, cells


def _best(cells: dict[tuple[str, str], ResultSummary], rows: list[str], task: str, digits: int) -> set[str]:
    """Row labels holding the best mean of a task (ties at the shown precision all count)."""
    shown = {r: round(cells[(r, task)].mean, digits) for r in rows  # type: ignore[arg-type]
             if (r, task) in cells and cells[(r, task)].mean is not None}
    if not shown:
        return set()
    top = max(shown.values())
    return {r for r, v in shown.items() if v == top}


def to_markdown(summaries: Sequence[ResultSummary], digits: int = 4) -> str:
    """A GitHub Markdown table, configs × tasks, best per task in bold, † for mixed levels."""
    rows, columns, cells = _grid(summaries)
    if not rows:
        return ""

    def esc(text: str) -> str:
        return text.replace("|", "\\|").replace("_", "\\_").replace("*", "\\*")

    lines = ["| config | " + " | ".join(f"{esc(t)} ({m})" for t, m in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    best = {t: _best(cells, rows, t, digits) for t, _ in columns}
    mixed = False
    for label in rows:
        out = []
        for task, _ in columns:
            s = cells.get((label, task))
            if s is None:
                out.append("")
                continue
            text = _score(s, digits)
            if label in best[task]:
                text = f"**{text}**"
            if s.mixed_levels:
                text += " †"
                mixed = True
            out.append(text)
        lines.append(f"| {esc(label)} | " + " | ".join(out) + " |")
    if mixed:
        lines += ["", DAGGER_NOTE]
    return "\n".join(lines) + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                  "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def to_latex(summaries: Sequence[ResultSummary], digits: int = 4) -> str:
    """A LaTeX tabular (no packages needed), configs × tasks, best per task in \\textbf,
    $^\\dagger$ for mixed levels with a note below."""
    rows, columns, cells = _grid(summaries)
    if not rows:
        return ""
    lines = [r"\begin{tabular}{l" + "r" * len(columns) + "}", r"\hline",
             "config & " + " & ".join(f"{latex_escape(t)} ({latex_escape(m)})" for t, m in columns) + r" \\",
             r"\hline"]
    best = {t: _best(cells, rows, t, digits) for t, _ in columns}
    mixed = False
    for label in rows:
        out = []
        for task, _ in columns:
            s = cells.get((label, task))
            if s is None or s.mean is None:
                out.append("--" if s is not None else "")
                continue
            text = f"{s.mean:.{digits}f} $\\pm$ {s.std:.{digits}f}"
            if label in best[task]:
                text = f"\\textbf{{{text}}}"
            if s.mixed_levels:
                text += r"$^\dagger$"
                mixed = True
            out.append(text)
        lines.append(latex_escape(label) + " & " + " & ".join(out) + r" \\")
    lines += [r"\hline", r"\end{tabular}"]
    if mixed:
        lines.append(r"$^\dagger$ seeds ran at different degradation-ladder levels.")
    return "\n".join(lines) + "\n"
