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


@pytest.mark.parametrize("text", [
    "\U0001f469\u200d\U0001f52c",  # 👩‍🔬: a woman scientist, joined by U+200D
    "\U0001f3f3\ufe0f\u200d\U0001f308",  # 🏳️‍🌈: a flag, a variation selector and a joiner
    "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian: a zero-width non-joiner in a word
    "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",  # Scotland's flag: tag characters
    "hyphen\u00adation",  # a soft hyphen
])
def test_format_characters_that_are_text_are_shown_as_written(text: str) -> None:
    assert one_line(text) == text and shown_lines(f"{text}\n{text}") == f"{text}\n{text}"


def test_invisible_operators_and_deprecated_format_controls_are_escaped() -> None:
    hidden = "\u2060\u2061\u2062\u2063\u2064\u206a\u206b\u206c\u206d\u206e\u206f\ufff9\ufffa\ufffb\u2029"
    assert one_line(hidden) == "".join(f"\\u{ord(c):04x}" for c in hidden)
    assert one_line("\U0001f469\u200d\u202e\U0001f52c") == "\U0001f469\u200d\\u202e\U0001f52c"




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
