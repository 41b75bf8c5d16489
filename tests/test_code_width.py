"""No line of our Python, or of the web page's own JavaScript, passes 120 columns. The formatter
wraps new Python at 100 (pyproject.toml's `line-length`) and ruff's E501 caps every line at 120,
but CI runs only pytest: this test is what keeps the cap. Columns are characters, not bytes, so
`§` or `·` in a string counts once."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED_DIRS = ("orchestrator", "workers", "benchmarks", "tests", "examples")
MAX_COLUMNS = 120


def over_width(text: str, max_columns: int = MAX_COLUMNS) -> list[tuple[int, int]]:
    """(line number, columns) of each line longer than max_columns characters."""
    return [
        (n, len(line)) for n, line in enumerate(text.splitlines(), 1) if len(line) > max_columns
    ]


def test_over_width_counts_characters_not_bytes() -> None:
    assert over_width("§" * 120 + "\n" + "x" * 121 + "\n") == [(2, 121)]
    assert over_width("ok\n" + " " * 121) == [(2, 121)]


@pytest.mark.parametrize("folder", CHECKED_DIRS)
def test_no_line_passes_120_columns(folder: str) -> None:
    paths = sorted((ROOT / folder).rglob("*.py"))
    assert paths, f"no Python files under {folder}/"
    too_long = [
        f"{path.relative_to(ROOT)}:{n} ({columns} columns)"
        for path in paths
        for n, columns in over_width(path.read_text(encoding="utf-8"))
    ]
    assert not too_long, f"lines over {MAX_COLUMNS} columns (wrap them):\n" + "\n".join(too_long)


def test_no_line_of_our_javascript_passes_120_columns() -> None:
    """The web page's scripts (the vendored, minified uPlot aside: it is npm's file as published)."""
    paths = [
        p
        for p in sorted((ROOT / "orchestrator" / "web").rglob("*.js"))
        if not p.name.endswith(".min.js")
    ]
    assert paths, "no JavaScript under orchestrator/web/"
    too_long = [
        f"{path.relative_to(ROOT)}:{n} ({columns} columns)"
        for path in paths
        for n, columns in over_width(path.read_text(encoding="utf-8"))
    ]
    assert not too_long, f"lines over {MAX_COLUMNS} columns (wrap them):\n" + "\n".join(too_long)
