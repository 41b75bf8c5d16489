"""Results as configs × tasks grids to paste into a paper: GitHub Markdown and LaTeX. Pure.

A row is one effective config (`r8 [learning_rate=0.001]`), a column one (task, metric) followed
by its val column (where some row reports val) and its `n` column (`3`, or `3 of 4 (seed 4
failed)`): configs that report different metrics on a
task get a column each, and a cell is filled only from the summary of its own row, task and
metric. Rows and columns come in suite order. Bold is the choice of results.selection (on the
validation split where reported; never a row with n < 2; the lowest for a loss or an error; one
row per column). Under the grid: what the std and val are, what bold means and how ties break.
Marks and their legend are those of results.formats; a cell with notes is marked `*` and its
notes are listed under the grid. A table with runs still queued or running is printed only when
asked for as partial, and then says so on its first line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from orchestrator.results.aggregate import ResultSummary
from orchestrator.results.formats import (
    cell_marks,
    column_title,
    legend_lines,
    score,
    score_line,
    table_lines,
    val_score,
)
from orchestrator.results.selection import (
    Basis,
    ColumnChoice,
    bold_legend,
    choice_notes,
    choose,
    is_chosen,
    lower_is_better,
)
from orchestrator.wording import one_line

Column = tuple[str, str]  # (task, metric)
Cell = tuple[str, str, str]  # (row label, task, metric)
__all__ = ["lower_is_better", "to_latex", "to_markdown"]


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
    order: dict[Column, tuple[object, ...]] = {}
    for s in summaries:
        order.setdefault((s.task, s.metric), (s.task_order, s.task, s.metric))
    columns.sort(key=lambda column: order[column])
    return rows, columns, cells


def _row_cells(
    label: str, columns: list[Column], cells: dict[Cell, ResultSummary], choices: dict[Column, ColumnChoice],
    render: Callable[[ResultSummary, bool], str], escape: Callable[[str], str], with_val: set[Column],
    digits: int,
) -> list[str]:
    """A row's cells in column order, each followed by its val cell (where the column has val)
    and its n cell: "" where the row has no summary, else `render(summary, chosen)`."""
    out = []
    for task, metric in columns:
        s = cells.get((label, task, metric))
        val = (task, metric) in with_val
        if s is None:
            out += ["", ""] + ([""] if val else [])
            continue
        out.append(render(s, is_chosen(s, choices)))
        if val:
            out.append(escape(val_score(s, digits) or "—"))
        out.append(escape(s.n_text))
    return out


def val_columns(summaries: Sequence[ResultSummary]) -> set[Column]:
    """The columns some row of which reports val: they get a val column beside the test one."""
    return {(s.task, s.metric) for s in summaries if s.val_n}


def _footer(
    summaries: Sequence[ResultSummary], choices: dict[Column, ColumnChoice], escape: Callable[[str], str] = str,
    escape_line: Callable[[str], str] = str,
) -> list[str]:
    """The lines under a grid. The bold legend and the choice notes name metrics, tasks and
    configs (user text) in plain prose: `escape_line` escapes each whole; the legend lines are
    our own text, only their rung names `escape`d."""
    bold = bold_legend(choices, {s.metric for s in summaries})
    scores = score_line(bool(val_columns(summaries)), any(s.pooled for s in summaries))
    named = ([bold] if bold else []) + choice_notes(choices)
    return [scores] + [escape_line(line) for line in named] + legend_lines(summaries, escape=escape)


def _notes(rows: list[str], columns: list[Column], cells: dict[Cell, ResultSummary]) -> list[str]:
    return [f"{label} · {column_title(task, metric)}: {note}" for label in rows for task, metric in columns
            if (s := cells.get((label, task, metric))) is not None for note in s.notes]


def md_escape(text: str) -> str:
    """A Markdown table cell: `\\` and `|` escaped (a bare `|` splits the cell), emphasis, code,
    link and strikethrough characters escaped, HTML's `<` and `&` made harmless, line ends made
    spaces and every other hidden character (a control, a bidirectional override) shown escaped
    as `one_line` shows it."""
    out = one_line(text.replace("\r", " ").replace("\n", " "))
    out = out.replace("\\", "\\\\").replace("&", "&amp;")  # `&lt;` in a name shows as typed
    for ch in ("|", "*", "_", "`", "[", "]", "~"):  # `~` strikes text through in GitHub Markdown
        out = out.replace(ch, "\\" + ch)
    return out.replace("<", "&lt;")


_BLOCK_START = re.compile(r"^( {0,3})(?:([#>+=\-])|(\d{1,9})([.)]))")


def md_line(text: str) -> str:
    """A line of Markdown prose (or a list item's text) holding user text: md_escape, and a
    start that would open a block (`#` heading, `>` quote, `-`/`+` list, `===`/`---` turning the
    line above into a heading, `1.` list) escaped, since such a line may interrupt a paragraph."""
    return _BLOCK_START.sub(lambda m: m[1] + ("\\" + m[2] if m[2] else m[3] + "\\" + m[4]), md_escape(text))


def to_markdown(summaries: Sequence[ResultSummary], digits: int = 4, select: Basis | None = None) -> str:
    """A GitHub Markdown table, effective configs × (task, metric) with an n column each, the
    chosen row of each column in bold."""
    rows, columns, cells = grid(summaries)
    if not rows:
        return ""
    lines = [md_escape(line) for line in table_lines(summaries)]
    lines += [""] if lines else []
    with_val = val_columns(summaries)
    heads = [md_escape(column_title(t, m)) + (" | val" if (t, m) in with_val else "") + " | n"
             for t, m in columns]
    lines += ["| config | " + " | ".join(heads) + " |",
              "|---|" + "".join("---:|---:|---:|" if c in with_val else "---:|---:|" for c in columns)]
    choices = choose(summaries, digits, select)

    def render(s: ResultSummary, is_best: bool) -> str:
        text = f"**{score(s, digits)}**" if is_best else score(s, digits)
        marks = cell_marks(s)
        return text + (" " + " ".join(md_escape(m) for m in marks) if marks else "")

    for label in rows:
        lines.append(
            f"| {md_escape(label)} | "
            + " | ".join(
                _row_cells(label, columns, cells, choices, render, md_escape, with_val, digits)
            )
            + " |"
        )
    # Outside the table: the legend's own sentences need only a leading `*` escaped (it would
    # start a list); lines naming user text go through md_line
    legend = [("\\" + line) if line.startswith("*") else line
              for line in _footer(summaries, choices, md_escape, md_line)]
    notes = [f"- {md_line(note)}" for note in _notes(rows, columns, cells)]
    if legend:
        lines += [""] + [line + "  " for line in legend[:-1]] + legend[-1:]
    if notes:
        lines += ["", "Notes:", "", *notes]
    return "\n".join(lines) + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                  "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "\n": " ", "\r": " ", "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
                  "`": "'"}
# in a $^{...}$ superscript
_LATEX_MARKS = {"⊕": r"\oplus", "†": r"\dagger", "‡": r"\ddagger", "§": r"\S", "¶": r"\P", "◇": r"\diamond",
                "♯": r"\sharp", "‖": r"\|", "*": "*"}
_LATEX_TEXT = {"⊕": r"$^\oplus$", "†": r"$^\dagger$", "‡": r"$^\ddagger$", "§": r"$^\S$", "¶": r"$^\P$",
               "◇": r"$^\diamond$", "♯": r"$^\sharp$", "‖": r"$^\|$",
               "*": r"$^*$", "×": r"$\times$", "±": r"$\pm$", "·": r"\textperiodcentered{}", "—": "---",
               "≥": r"$\geq$", "≤": r"$\leq$", "−": "$-$", "→": r"$\to$", "–": "--", "…": r"\ldots{}"}


def latex_escape(text: str) -> str:
    """Text for LaTeX: `& % $ # _ { } ~ ^ \\` escaped (and `< > |`, which the default font
    does not have), `--` kept two hyphens, line ends made spaces, every other hidden character
    (a control, a bidirectional override) shown escaped as `one_line` shows it."""
    text = one_line(text.replace("\r", " ").replace("\n", " "))
    out = []
    for i, ch in enumerate(text):
        if ch == "-" and text[i + 1 : i + 2] == "-":
            out.append("-{}")  # `--` would print an en dash
        else:
            out.append(_LATEX_SPECIAL.get(ch, _LATEX_TEXT.get(ch, ch)))
    return "".join(out)


def _latex_marks(marks: list[str]) -> str:
    return "$^{" + "".join(_LATEX_MARKS[m] + " " for m in marks).rstrip() + "}$" if marks else ""


def to_latex(summaries: Sequence[ResultSummary], digits: int = 4, select: Basis | None = None) -> str:
    """A LaTeX tabular (no packages needed), effective configs × (task, metric) with an n column
    each, the chosen row of each column in \\textbf, marks as superscripts with their legend and
    the notes below."""
    rows, columns, cells = grid(summaries)
    if not rows:
        return ""
    lines = [latex_escape(line) + r"\par" for line in table_lines(summaries)]
    with_val = val_columns(summaries)
    heads = [latex_escape(column_title(t, m)) + (" & val" if (t, m) in with_val else "") + " & $n$"
             for t, m in columns]
    lines += [r"\begin{tabular}{l" + "".join("rrr" if c in with_val else "rr" for c in columns) + "}", r"\hline",
              "config & " + " & ".join(heads) + r" \\",
              r"\hline"]
    choices = choose(summaries, digits, select)

    def render(s: ResultSummary, is_best: bool) -> str:
        text = score(s, digits).replace("±", "$\\pm$").replace("—", "--")
        if s.mean is not None and is_best:
            text = f"\\textbf{{{text}}}"
        return text + _latex_marks(cell_marks(s))

    for label in rows:
        lines.append(
            latex_escape(label)
            + " & "
            + " & ".join(
                _row_cells(label, columns, cells, choices, render, latex_escape, with_val, digits)
            )
            + r" \\"
        )
    lines += [r"\hline", r"\end{tabular}"]
    lines += [latex_escape(line) + r"\par" for line in _footer(summaries, choices)]
    notes = _notes(rows, columns, cells)
    if notes:
        lines += [r"Notes:\par"] + [latex_escape(note) + r"\par" for note in notes]
    return "\n".join(lines) + "\n"
