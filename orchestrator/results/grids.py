"""Results as configs × tasks grids to paste into a paper: GitHub Markdown and LaTeX. Pure.

A row is one effective config (`r8 [learning_rate=0.001]`), a column one (task, metric): configs
that report different metrics on a task get a column each, and a cell is filled only from the
summary of its own row, task and metric. The best mean of each column is bold (the lowest for a
loss or an error). Marks and their legend are those of results.formats; a cell with notes is
marked `*` and its notes are listed under the grid.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from orchestrator.results.aggregate import ResultSummary
from orchestrator.results.formats import cell_marks, legend_lines, score

# whole words of a metric's name only (`eval_loss`, `wer`, not `exact_answer` or `lossless`)
_LOWER_IS_BETTER = re.compile(r"(^|_)(loss|error|err|perplexity|ppl|mse|mae|rmse|wer|cer)($|_)", re.IGNORECASE)
Column = tuple[str, str]  # (task, metric)
Cell = tuple[str, str, str]  # (row label, task, metric)


def lower_is_better(metric: str) -> bool:
    """A loss, an error rate or a perplexity: the best is the lowest."""
    return bool(_LOWER_IS_BETTER.search(metric))


def grid(summaries: Sequence[ResultSummary]) -> tuple[list[str], list[Column], dict[Cell, ResultSummary]]:
    """Row labels (effective configs, with the suite when several), columns (task, metric), cells."""
    several_suites = len({s.suite for s in summaries}) > 1
    rows: list[str] = []
    columns: list[Column] = []
    cells: dict[Cell, ResultSummary] = {}
    for s in summaries:
        label = f"{s.suite}/{s.label}" if several_suites else s.label
        if label not in rows:
            rows.append(label)
        if (s.task, s.metric) not in columns:
            columns.append((s.task, s.metric))
        cells[(label, s.task, s.metric)] = s
    columns.sort()
    return rows, columns, cells


def best_rows(cells: dict[Cell, ResultSummary], rows: list[str], column: Column, digits: int) -> set[str]:
    """Row labels holding the best mean of a column (ties at the shown precision all count)."""
    task, metric = column
    shown = {r: round(s.mean, digits) for r in rows
             if (s := cells.get((r, task, metric))) is not None and s.mean is not None}
    if not shown:
        return set()
    top = min(shown.values()) if lower_is_better(metric) else max(shown.values())
    return {r for r, v in shown.items() if v == top}


def _row_cells(
    label: str, columns: list[Column], cells: dict[Cell, ResultSummary], best: dict[Column, set[str]],
    render: Callable[[ResultSummary, bool], str],
) -> list[str]:
    """A row's cells in column order: "" where the row has no summary, else `render(summary,
    holds the column's best mean)`."""
    return ["" if (s := cells.get((label, task, metric))) is None else render(s, label in best[(task, metric)])
            for task, metric in columns]


def _notes(rows: list[str], columns: list[Column], cells: dict[Cell, ResultSummary]) -> list[str]:
    return [f"{label} · {task} ({metric}): {note}" for label in rows for task, metric in columns
            if (s := cells.get((label, task, metric))) is not None for note in s.notes]


def md_escape(text: str) -> str:
    """A Markdown table cell: `\\` and `|` escaped (a bare `|` splits the cell), emphasis and
    code characters escaped, HTML's `<` and line ends made harmless."""
    out = text.replace("\\", "\\\\")
    for ch in ("|", "*", "_", "`", "[", "]"):
        out = out.replace(ch, "\\" + ch)
    return out.replace("<", "&lt;").replace("\r", " ").replace("\n", " ")


def to_markdown(summaries: Sequence[ResultSummary], digits: int = 4) -> str:
    """A GitHub Markdown table, effective configs × (task, metric), best per column in bold."""
    rows, columns, cells = grid(summaries)
    if not rows:
        return ""
    lines = ["| config | " + " | ".join(f"{md_escape(t)} ({md_escape(m)})" for t, m in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    best = {column: best_rows(cells, rows, column, digits) for column in columns}

    def render(s: ResultSummary, is_best: bool) -> str:
        text = f"**{score(s, digits)}**" if is_best else score(s, digits)
        marks = cell_marks(s)
        return text + (" " + " ".join(md_escape(m) for m in marks) if marks else "")

    for label in rows:
        lines.append(f"| {md_escape(label)} | " + " | ".join(_row_cells(label, columns, cells, best, render)) + " |")
    # Our own sentences, outside the table: only a leading `*` would start a list
    legend = [("\\" + line) if line.startswith("*") else line for line in legend_lines(summaries)]
    notes = [f"- {md_escape(note)}" for note in _notes(rows, columns, cells)]
    if legend:
        lines += [""] + [line + "  " for line in legend[:-1]] + legend[-1:]
    if notes:
        lines += ["", "Notes:", "", *notes]
    return "\n".join(lines) + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                  "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "\n": " ", "\r": " ", "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
                  "`": "'"}
_LATEX_MARKS = {"†": r"\dagger", "‡": r"\ddagger", "§": r"\S", "¶": r"\P", "‖": r"\|", "*": "*"}  # in $^{...}$
_LATEX_TEXT = {"†": r"$^\dagger$", "‡": r"$^\ddagger$", "§": r"$^\S$", "¶": r"$^\P$", "‖": r"$^\|$", "*": r"$^*$",
               "×": r"$\times$",
               "±": r"$\pm$", "·": r"\textperiodcentered{}"}


def latex_escape(text: str) -> str:
    """Text for LaTeX: `& % $ # _ { } ~ ^ \\` escaped (and `< > |`, which the default font
    does not have), `--` kept two hyphens, line ends made spaces."""
    out = []
    for i, ch in enumerate(text):
        if ch == "-" and text[i + 1 : i + 2] == "-":
            out.append("-{}")  # `--` would print an en dash
        else:
            out.append(_LATEX_SPECIAL.get(ch, _LATEX_TEXT.get(ch, ch)))
    return "".join(out)


def _latex_marks(marks: list[str]) -> str:
    return "$^{" + "".join(_LATEX_MARKS[m] + " " for m in marks).rstrip() + "}$" if marks else ""


def to_latex(summaries: Sequence[ResultSummary], digits: int = 4) -> str:
    """A LaTeX tabular (no packages needed), effective configs × (task, metric), best per column
    in \\textbf, marks as superscripts with their legend and the notes below."""
    rows, columns, cells = grid(summaries)
    if not rows:
        return ""
    lines = [r"\begin{tabular}{l" + "r" * len(columns) + "}", r"\hline",
             "config & " + " & ".join(f"{latex_escape(t)} ({latex_escape(m)})" for t, m in columns) + r" \\",
             r"\hline"]
    best = {column: best_rows(cells, rows, column, digits) for column in columns}

    def render(s: ResultSummary, is_best: bool) -> str:
        text = "--" if s.mean is None else f"{s.mean:.{digits}f} $\\pm$ {s.std:.{digits}f}"
        if s.mean is not None and is_best:
            text = f"\\textbf{{{text}}}"
        return text + _latex_marks(cell_marks(s))

    for label in rows:
        lines.append(latex_escape(label) + " & " + " & ".join(_row_cells(label, columns, cells, best, render)) + r" \\")
    lines += [r"\hline", r"\end{tabular}"]
    lines += [latex_escape(line) + r"\par" for line in legend_lines(summaries)]
    notes = _notes(rows, columns, cells)
    if notes:
        lines += [r"Notes:\par"] + [latex_escape(note) + r"\par" for note in notes]
    return "\n".join(lines) + "\n"
