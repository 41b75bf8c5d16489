"""A name written by user code (a metric name with a line break) stays on its row of a plain
table: shown escaped, never splitting the row."""

from __future__ import annotations

import json
import shlex
import sys

import pytest
from e2e_helpers import Orch, requires_tmux

from orchestrator.cli.plain_table import render_plain
from orchestrator.wording import one_line, shown_lines


def test_one_line_escapes_line_breaks_and_control_characters() -> None:
    assert one_line("acc\nuracy\r\x1b]0;t\x07") == "acc\\nuracy\\r\\x1b]0;t\\x07"
    assert one_line("plain name · ü") == "plain name · ü"
    lines = render_plain(["name", "state"], [["a\nb", "ok"], ["c", "ok"]]).splitlines()
    assert len(lines) == 3 and "a\\nb" in lines[1]


def test_one_line_shows_bidirectional_and_other_format_characters_escaped() -> None:
    # a right-to-left override, isolates, marks, zero-width and C1 characters, a line separator and a
    # lone surrogate (JSON's `\ud800`) reorder, hide or break what a reader sees: each shown escaped
    hidden = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c\u200b\ufeff\x85\x9b\u2028\ud800"
    shown = one_line(f"acc{hidden}uracy")
    assert shown == ("acc\\u202a\\u202b\\u202c\\u202d\\u202e\\u2066\\u2067\\u2068\\u2069\\u200e\\u200f\\u061c"
                     "\\u200b\\ufeff\\x85\\x9b\\u2028\\ud800uracy")
    assert shown.isprintable() and shown.isascii()
    assert one_line("naïve · 中文 🙂 a\u00a0b") == "naïve · 中文 🙂 a\u00a0b"  # letters, symbols, spaces: as they are
    assert shown_lines("a\nb\tc\u202ed\r") == "a\nb\tc\\u202ed\\r"  # several lines: breaks and tabs kept
    assert render_plain(["name"], [["x\u202ey"]]).splitlines()[1] == "x\\u202ey"




@requires_tmux
@pytest.mark.tmux
def test_a_metric_name_with_a_line_break_keeps_its_row(orch: Orch) -> None:
    script = orch.root / "worker.py"
    result = {"status": "succeeded", "metrics": {"test": {"acc\nuracy": 0.5}}}
    script.write_text("import json, os, pathlib\n"
                      f"pathlib.Path(os.environ['ORCH_RUN_DIR'], 'result.json').write_text({json.dumps(result)!r})\n")
    worker = shlex.join([sys.executable, str(script)])
    orch.write_suite("n", {"n": {}}, worker=worker, mem_gib=1)
    orch.submit("n", "1:a")
    orch.start_daemon()
    assert orch.wait_all_done(60) == {1: "succeeded"}
    table = orch.run("results").stdout.splitlines()
    row = next(line for line in table if "uracy" in line)
    assert "acc\\nuracy" in row and "0.5" in row
