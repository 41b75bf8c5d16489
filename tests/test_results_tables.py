"""Results tables that are right and safe: a grid cell holds only its own (task, metric), the
best of a column is bold, names are escaped for Markdown and LaTeX, CSV cells a spreadsheet
would run are neutralised (CLI, /results.csv, the report), and a progress line is no result."""

from __future__ import annotations

import csv
import io
import shlex
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml

from orchestrator.attempts.printed_results import parse_result
from orchestrator.cli.results import _print_table
from orchestrator.results.aggregate import ResultRow, aggregate
from orchestrator.results.formats import csv_cell, to_csv
from orchestrator.results.grids import latex_escape, md_escape, md_line, to_latex, to_markdown
from orchestrator.results.selection import choose
from tests.e2e_helpers import Orch, orch_env, requires_tmux

HOSTILE = '=HYPERLINK("http://example.invalid")'


def _cells(line: str) -> list[str]:
    """A Markdown table row's cells: split on `|` not escaped by a backslash."""
    cells, current, escaped = [], "", False
    for ch in line.strip()[1:-1]:
        if ch == "|" and not escaped:
            cells.append(current)
            current = ""
        else:
            current += ch
        escaped = ch == "\\" and not escaped
    return [*cells, current]


def different_metrics() -> list[ResultRow]:
    # Config "a" reports accuracy on the task, config "b" only a loss (a script's own task).
    return [ResultRow("E", "a", "toy", 1, {"accuracy": 0.9}), ResultRow("E", "a", "toy", 2, {"accuracy": 0.7}),
            ResultRow("E", "b", "toy", 1, {"loss": 0.4}), ResultRow("E", "b", "toy", 2, {"loss": 0.5}),
            ResultRow("E", "c", "toy", 1, {"loss": 0.2}), ResultRow("E", "c", "toy", 2, {"loss": 0.3}),
            ResultRow("E", "d", "toy", 1, {"loss": 0.1})]  # one seed: lowest, but no evidence


def test_markdown_cells_hold_their_own_metric_and_the_best_is_bold() -> None:
    lines = to_markdown(aggregate(different_metrics())).splitlines()
    assert lines[0] == "| config | toy (accuracy) | n | toy (loss) | n |"
    rows = {_cells(line)[0].strip(): [c.strip() for c in _cells(line)[1:]] for line in lines[2:6]}
    assert rows["a"] == ["**0.8000 ± 0.1414**", "2", "", ""]  # never copied into the loss column
    assert rows["b"] == ["", "", "0.4500 ± 0.0707", "2"]
    assert rows["c"] == ["", "", "**0.2500 ± 0.0707**", "2"]  # the lowest loss is the best
    assert rows["d"] == ["", "", "0.1000 ± —", "1"]  # n = 1: no std, never bold


def test_latex_cells_hold_their_own_metric_and_the_best_is_bold() -> None:
    text = to_latex(aggregate(different_metrics()))
    assert "a & \\textbf{0.8000 $\\pm$ 0.1414} & 2 &  &  \\\\" in text
    assert "b &  &  & 0.4500 $\\pm$ 0.0707 & 2 \\\\" in text
    assert "c &  &  & \\textbf{0.2500 $\\pm$ 0.0707} & 2 \\\\" in text
    assert "d &  &  & 0.1000 $\\pm$ -- & 1 \\\\" in text


def test_markdown_escapes_pipes_backslashes_and_underscores_in_names() -> None:
    rows = [
        ResultRow("E", "x", "t_1", 1, {"f1|macro_avg\\": 0.5}),
        ResultRow("E", "y", "t_1", 1, {"f1|macro_avg\\": 0.6}),
    ]
    lines = to_markdown(aggregate(rows)).splitlines()
    assert len(_cells(lines[0])) == 3 and len(_cells(lines[2])) == 3  # the `|` in the name split nothing
    assert lines[0] == "| config | t\\_1 (f1\\|macro\\_avg\\\\) | n |"
    assert md_escape("a|b\\c_d*e\nf") == "a\\|b\\\\c\\_d\\*e f"


def test_markdown_lines_under_the_grid_escape_the_names_they_hold() -> None:
    # pure: a config whose loss diverged would be chosen, so a choice note names it and the
    # chosen one; the bold legend names the loss metric; the notes name configs. User names
    # must neither split, restyle nor open a block (heading, list) in any of them: the choice
    # note's line starts with the task, `# ...`, which would be a heading.
    def row(job: int, config: str, seed: int, test: float, diverged: str | None = None) -> ResultRow:
        return ResultRow("E", config, "# t_`k|", seed, {"x*y_loss": test}, job=job, diverged=diverged)

    rows = [row(1, "w_i*ld|x", 1, 0.1, "boom"), row(2, "w_i*ld|x", 2, 0.1), row(3, "# c~a~lm", 1, 0.7),
            row(4, "# c~a~lm", 2, 0.8), row(5, "1. solo", 1, 0.9), row(6, "1. solo", 1, 0.9)]
    under = to_markdown(aggregate(rows)).split("\n\n", 1)[1]
    assert ("\\# t\\_\\`k\\| (x\\*y\\_loss): w\\_i\\*ld\\|x has the best test mean but a counted run's loss "
            "diverged (♯): not chosen; # c\\~a\\~lm chosen") in under
    assert "lowest is best for x\\*y\\_loss;" in under
    assert "- 1\\. solo · # t\\_\\`k\\| (x\\*y\\_loss): seed 1 ran twice" in under
    for text in (*[r.config for r in rows], "# t_`k|", "x*y_loss"):
        assert text not in under  # every name appears only escaped
    assert md_line("# a") == "\\# a" and md_line("=== x") == "\\=== x" and md_line("2) b") == "2\\) b"
    assert md_line("- a") == "\\- a" and md_line("> q") == "\\> q" and md_line("a # b") == "a # b"
    assert md_escape("a&lt;b~c~") == "a&amp;lt;b\\~c\\~"
    latex = to_latex(aggregate(rows))  # LaTeX escapes its whole note lines already
    assert "\\# t\\_'k\\textbar{} (x$^*$y\\_loss): w\\_i$^*$ld\\textbar{}x has the best test mean" in latex


def test_latex_escapes_every_special_character() -> None:
    assert latex_escape("&%$#_{}~^\\") == ("\\&\\%\\$\\#\\_\\{\\}\\textasciitilde{}\\textasciicircum{}"
                                           "\\textbackslash{}")
    assert latex_escape("a--b<c>|") == "a-{}-b\\textless{}c\\textgreater{}\\textbar{}"  # no en dash, no ¡
    text = to_latex(aggregate([ResultRow("E", "x", "t", 1, {"a_b&c%d": 0.5})]))
    assert "config & t (a\\_b\\&c\\%d) & $n$ \\\\" in text


def test_a_bidirectional_override_in_a_name_is_shown_escaped_under_every_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a metric whose name reverses its own end (U+202E), a setting with an isolate and a mark: the
    # terminal table's cells and lines under it, Markdown and LaTeX show each escaped (`\u202e`)
    metric, hidden = "acc\u202eycarucca", ("\u202e", "\u2066", "\u200f")

    def row(job: int, config: str, seed: int, value: float, diverged: str | None = None) -> ResultRow:
        return ResultRow("E", config, "t", seed, {metric: value}, job=job, overrides={"note": "x\u2066y\u200f"},
                         diverged=diverged)

    # w would be chosen but diverged: the choice note names both settings and the metric
    summaries = aggregate([row(1, "w", 1, 0.9, "boom"), row(2, "w", 2, 0.9), row(3, "c", 1, 0.7), row(4, "c", 2, 0.8)])
    # the terminal: what `orch results` prints, its table and the lines under it
    _print_table(summaries, 4, choose(summaries, 4), "no results")
    outputs = {"terminal": capsys.readouterr().out, "markdown": to_markdown(summaries), "latex": to_latex(summaries)}
    for name, text in outputs.items():
        assert not any(ch in text for ch in hidden), name
    assert "t (acc\\u202eycarucca): w [note=x\\u2066y\\u200f] has the best test mean" in outputs["terminal"]
    assert outputs["terminal"].count("note=x\\u2066y\\u200f") >= 4  # both rows' cells and the note
    assert "t (acc\\\\u202eycarucca): w \\[note=x\\\\u2066y\\\\u200f\\] has the best" in outputs["markdown"]
    assert "w [note=x\\textbackslash{}u2066y\\textbackslash{}u200f] & 0.9000" in outputs["latex"]


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_csv_cells_a_spreadsheet_would_run_are_neutralised(start: str) -> None:
    rows = [ResultRow("E", "x", "t", 1, {f"{start}cmd()": -0.5})]
    parsed = list(csv.DictReader(io.StringIO(to_csv(aggregate(rows)), newline="")))
    assert parsed[0]["metric"] == f"'{start}cmd()"
    assert parsed[0]["mean"] == "-0.5"  # numbers orch writes stay numbers
    assert csv_cell(f"{start}x").startswith("\"'")
    assert csv_cell("plain") == "plain" and csv_cell('a,"b"') == '"a,""b"""'


def test_a_progress_line_is_not_the_result() -> None:
    tail = '{"accuracy": 0.8}\n{"step": 1e30, "loss": 0.25, "epoch": 1}\n'
    assert parse_result(tail) == {"accuracy": 0.8}
    assert parse_result('{"step": 100, "eval_accuracy": 0.7}\n') == {"eval_accuracy": 0.7}
    from orchestrator.results.collect import finite_metrics

    assert finite_metrics({"step": 100, "epoch": 2, "eval_accuracy": 0.7}) == {"eval_accuracy": 0.7}


# A script that prints a hostile metric name for one task, and its result followed by a
# progress line with an absurd step for the other.
SCRIPT = textwrap.dedent(
    """\
    import json
    import sys

    if sys.argv[1] == "inject":
        print(json.dumps({HOSTILE: 0.5}))
    else:
        print(json.dumps({"accuracy": 0.8}))
        print(json.dumps({"step": 1e30, "loss": 0.25}))
    """
).replace("HOSTILE", repr(HOSTILE))


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path) as env:
        yield env


@requires_tmux
def test_printed_results_reach_every_csv_safely_and_a_progress_step_is_no_metric(live: Orch) -> None:
    (live.root / "s.py").write_text(SCRIPT)
    config_dir = live.plans / "configs" / "own"
    config_dir.mkdir(parents=True)
    (config_dir / "own.yaml").write_text(yaml.safe_dump({"learning_rate": 0.1}))
    (live.plans / "suites" / "own.yaml").write_text(yaml.safe_dump(
        {"worker": f"{shlex.quote(sys.executable)} s.py {{data}}", "mem_gib": 1, "configs": ["own"]}))
    live.submit("own", "1:inject,1:progress")
    live.start_daemon()
    assert set(live.wait_all_done(60).values()) == {"succeeded"}

    by_task = {row["task"]: row for row in live.json("results")}
    assert (by_task["progress"]["metric"], by_task["progress"]["mean"]) == ("accuracy", 0.8)
    assert by_task["inject"]["metric"] == HOSTILE  # the JSON says exactly what was printed

    def check(text: str) -> None:
        parsed = {r["task"]: r for r in csv.DictReader(io.StringIO(text, newline=""))}
        assert parsed["inject"]["metric"] == "'" + HOSTILE
        assert parsed["progress"]["metric"] == "accuracy"
        assert not any(line.startswith("=") or ",=" in line for line in text.splitlines())

    check(live.run("results", "--csv").stdout)
    pytest.importorskip("starlette", reason="needs the web extra")
    from starlette.testclient import TestClient

    from orchestrator.store import Store
    from orchestrator.web.app import create_app
    from orchestrator.web.report import render_report

    with TestClient(create_app(live.db, "t0ken"), base_url="http://127.0.0.1:8765") as client:
        check(client.get("/results.csv").text)
    with Store(live.db) as store:
        report = render_report(store)
    start = report.index("data:text/csv;charset=utf-8,") + len("data:text/csv;charset=utf-8,")
    check(unquote(report[start:report.index('"', start)]))


@pytest.mark.parametrize(
    ("metric", "lower"),
    [("loss", True), ("eval_loss", True), ("wer", True), ("test_cer", True), ("mse_avg", True), ("ERROR", True),
     ("exact_answer", False), ("answer", False), ("lossless_rate", False), ("accuracy", False), ("mcc", False)],
)
def test_lower_is_better_reads_whole_words_of_a_metric_name(metric: str, lower: bool) -> None:
    from orchestrator.results.grids import lower_is_better

    assert lower_is_better(metric) is lower
