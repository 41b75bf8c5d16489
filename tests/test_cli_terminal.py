"""What the commands print on a narrow terminal and into a pipe: dates whole, one line per
retry or event, plain columns when piped."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from orchestrator.store import Store
from tests.conftest import OrchRunner

SUBMIT = ("submit", "--suite", "demo", "--pairs", "87:glue_rte")
STARTED_S = 1_700_000_000.0


def add_attempt(db_path: Path, *, reason: str, outcome: str = "oom", exit_code: int = 3) -> None:
    with Store(db_path) as store, store.write():
        store.execute(
            "INSERT INTO attempts (job_id, n, level, level_step, gpu_index, gpu_uuid, run_dir, started_at, ended_at, "
            "outcome, exit_code, reason, changes_json, predicted_peak_mib, prediction_source, reserved_mib) "
            "VALUES (1, 1, 1, 'checkpointing', 0, 'GPU-0', '/nonexistent', ?, ?, ?, ?, ?, ?, 10000, "
            "'measured (running, step 10)', 0)",
            [STARTED_S, STARTED_S + 100, outcome, exit_code, reason,
             json.dumps({"gradient_checkpointing": True})],
        )


def on_terminal(monkeypatch: pytest.MonkeyPatch, module: Any, width: int) -> io.StringIO:
    """Make `module`'s Console a terminal of `width` columns writing into the returned buffer."""
    buffer = io.StringIO()

    def console(**kwargs: Any) -> Console:
        return Console(file=buffer, force_terminal=True, color_system=None, width=width, height=40)

    monkeypatch.setattr(module, "Console", console)
    return buffer


def test_show_at_80_columns_keeps_dates_whole(
    orch_inproc: OrchRunner, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import orchestrator.cli.jobs as jobs_module
    from orchestrator.cli.jobs import _ts

    assert orch_inproc(*SUBMIT).rc == 0
    add_attempt(db_path, reason="CUDA out of memory [bold]x[/]")
    buffer = on_terminal(monkeypatch, jobs_module, 80)
    assert orch_inproc("show", "1").rc == 0
    out = buffer.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 80
    assert _ts(STARTED_S) in out  # the start date and time on one line, whole
    assert "…" not in out
    assert "[bold]x[/]" in out  # a reason is text, never markup
    assert "measured (running, step 10)" in out
