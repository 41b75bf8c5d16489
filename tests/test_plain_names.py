"""A name written by user code (a metric name with a line break) stays on its row of a plain
table: shown escaped, never splitting the row."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from e2e_helpers import Orch, requires_tmux

from orchestrator.cli.plain_table import render_plain
from orchestrator.wording import one_line, shown_lines
from tests.conftest import OrchRunner


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


def test_the_escape_runs_only_on_characters_it_escapes(monkeypatch: pytest.MonkeyPatch) -> None:
    # one precompiled class of the hidden code points: text of `·`, `ü` and line breaks (a timeline
    # tooltip) calls back once per escaped character, not once per character beyond ASCII
    from orchestrator import wording

    calls: list[str] = []
    escaped = wording._escaped
    monkeypatch.setattr(wording, "_escaped", lambda found: calls.append(found[0]) or escaped(found))
    tip = "job 3 · attempt 1 · ü 中文 🙂\n" * 200
    assert shown_lines(tip) == tip and calls == []
    assert one_line(tip) == tip.replace("\n", "\\n") and calls == ["\n"] * 200


def test_exactly_the_hidden_code_points_are_escaped() -> None:
    from orchestrator.wording import _HIDDEN_RANGES

    codes = [*range(0x3000), *range(0xD7F0, 0xE010), *range(0xFE00, 0x10000), *range(0xE0000, 0xE0100)]
    hidden = {c for low, high in _HIDDEN_RANGES for c in range(low, high + 1)}
    assert hidden >= {0x0A, 0x1B, 0x85, 0x200B, 0x202E, 0x2066, 0xFEFF} and not hidden & {0x200C, 0x200D, 0xAD}
    for c in codes:  # every hidden character fails isprintable(): the fast path never skips one
        assert c not in hidden or not chr(c).isprintable()
    text = "".join(map(chr, codes))
    expected = "".join((f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") if c in hidden else chr(c) for c in codes)
    for name, char in (("n", "\n"), ("r", "\r"), ("t", "\t")):
        expected = expected.replace(f"\\x{ord(char):02x}", f"\\{name}")
    assert one_line(text) == expected
    assert shown_lines(text) == expected.replace("\\n", "\n").replace("\\t", "\t")




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


def test_orch_trials_shows_the_metric_keys_and_values_escaped() -> None:
    from orchestrator.cli.trials import trial_lines
    from orchestrator.results.trials import TrialRow

    rows = [TrialRow(0, {"lr\u202e": "x\u2066y"}, 0.5, 1, 1, {"succeeded": 1})]
    lines = trial_lines("hp", "random", "acc\u202e", "max", rows, "no trial reported 'f\x1b[2J'")
    assert not any(c in "".join(lines) for c in "\u202e\u2066\x1b")
    assert lines[1].endswith("lr\\u202e=x\\u2066y") and lines[2] == "note: no trial reported 'f\\x1b[2J'"
    assert lines[3] == "best: trial 0 (lr\\u202e=x\\u2066y): acc\\u202e 0.5000, mean of 1 seed(s)"


def test_orch_show_prints_settings_reasons_and_history_escaped(orch_inproc: OrchRunner, db_path: Path) -> None:
    from orchestrator.store.db import Store
    from orchestrator.store.jobs import cancel_queued

    submitted = orch_inproc("submit", "--suite", "demo", "--pairs", "87:glue-tvt_qnli",
                            "--set", "lr_scheduler=x\u202ey", "--json")
    assert submitted.rc == 0, submitted.stderr
    store = Store(db_path)
    try:
        cancel_queued(store, 1, "stop\u2066ped\x1b]0;title\x07")
    finally:
        store.close()
    shown = orch_inproc("show", "1")
    assert shown.rc == 0 and not any(c in shown.stdout for c in "\u202e\u2066\x1b\x07")
    assert "--set lr_scheduler=x\\u202ey" in shown.stdout
    assert "reason: stop\\u2066ped\\x1b]0;title\\x07" in shown.stdout
