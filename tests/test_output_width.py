"""Output is never cut where it matters: piped output keeps every value whole; a narrow terminal
keeps id, state, config and the reason readable; the live dashboard keeps its events on screen."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from orchestrator.cli.jobs.table import print_jobs
from orchestrator.cli.status.rich_view import render_status
from orchestrator.cli.tables import plain_columns
from orchestrator.store.queries import JobListRow
from tests.conftest import OrchRunner

LONG_CONFIG = "E1_QKVO_r16_alpha16_dropout05_lr2e-4"
LONG_REASON = "GPU 0: 10.0 GiB free, needs 14.7 GiB + 2.4 GiB headroom"


def job_row(job_id: int, config: str = LONG_CONFIG, state: str = "queued", reason: str | None = None) -> JobListRow:
    return JobListRow.from_row({"id": job_id, "state": state, "suite": "E1", "config_name": config, "seed": 127,
                                "data": "glue-tvt_qnli", "priority": 0, "gpu": None, "attempt_count": 0, "level": 0,
                                "wait_reason": LONG_REASON, "reason": reason})


def terminal(width: int, height: int = 40) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(width=width, height=height, file=buffer, force_terminal=True, color_system=None), buffer


def column_text(out: str, header: str, sep: str) -> str:
    """A column's cells read top to bottom (folded pieces joined by `sep`), located by the
    header line's column starts."""
    lines = out.splitlines()
    heads = lines[0].split()
    starts = [lines[0].index(f" {h} " if f" {h} " in lines[0] else h) for h in heads]
    i = heads.index(header)
    begin, end = starts[i], (starts[i + 1] if i + 1 < len(starts) else None)
    body = lines[1:]
    hint = next((n for n, line in enumerate(body) if line.startswith("(")), len(body))
    pieces = [line[begin:end].strip() for line in body[:hint]]
    return sep.join(p for p in pieces if p)


def test_piped_jobs_keep_every_value_whole(orch_inproc: OrchRunner) -> None:
    assert orch_inproc("submit", "--suite", "E1", "--pairs", "87:glue-tvt_qnli").rc == 0
    out = orch_inproc("jobs").stdout  # captured: not a terminal
    assert "…" not in out
    configs = [line.split()[3] for line in out.splitlines()[1:]]
    assert len(configs) == 44 and all(len(c) > 10 for c in configs)
    assert any("alpha16" in line for line in out.splitlines())
    assert max(len(line) for line in out.splitlines()) > 80  # wider than a terminal, as it must be
    assert out.splitlines()[0].split() == [
        "id",
        "state",
        "suite",
        "config",
        "setting",
        "seed",
        "data",
        "gpu",
        "att",
        "lvl",
        "metric",
        "time",
        "note",
    ]


def test_plain_columns_are_aligned_and_whole() -> None:
    text = plain_columns(("id", "config"), [("1", LONG_CONFIG), ("22", "a")])
    assert text.splitlines() == ["id  config", f"1   {LONG_CONFIG}", "22  a"]


def test_narrow_terminal_keeps_id_state_config_and_reason() -> None:
    for width in (50, 60, 80):
        console, buffer = terminal(width)
        print_jobs([job_row(12), job_row(1333, "E1_A_r8", "failed", "ladder exhausted")], console=console)
        out = buffer.getvalue()
        assert "…" not in out, width
        assert max(len(line) for line in out.splitlines()) <= width
        assert column_text(out, "id", " ").split() == ["12", "1333"]
        assert column_text(out, "state", " ").split() == ["queued", "failed"]
        assert column_text(out, "config", "") == LONG_CONFIG + "E1_A_r8"
        assert column_text(out, "note", " ") == f"{LONG_REASON} ladder exhausted"
        if width < 80:
            assert "--wide" in out


def test_wide_prints_every_column_unfolded() -> None:
    console, buffer = terminal(50)
    print_jobs([job_row(12)], wide=True, console=console)
    out = buffer.getvalue()
    assert any(LONG_CONFIG in line and LONG_REASON in line and "glue-tvt_qnli" in line for line in out.splitlines())


def snapshot(n_waiting: int, n_running: int, n_events: int) -> dict[str, Any]:
    now = time.time()
    return {
        "db": "state.db",
        "daemon": {"alive": True, "pid": 1, "draining": False, "last_tick_age_s": 0.1},
        "gpus": [{"index": i, "uuid": f"GPU-{i}", "name": "sim", "total_mib": 24576, "used_mib": 1000,
                  "orch_mib": 1000, "foreign_mib": 0, "free_mib": 23576, "utilization_pct": None,
                  "slots": 2, "running": 1} for i in range(2)],
        "counts": {"queued": n_waiting, "running": n_running, "succeeded": 0, "failed": 0, "cancelled": 0},
        "running": [{"id": 100 + i, "suite": "E1", "config": LONG_CONFIG, "seed": 87, "data": "glue-tvt_qnli",
                     "gpu": i % 2, "attempt": 1, "level": 0, "elapsed_s": 5.0, "held_mib": 1000,
                     "predicted_mib": 2000, "progress": {"step": 3, "total": 10, "loss": 0.5}}
                    for i in range(n_running)],
        "waiting": [{"id": i, "suite": "E1", "config": LONG_CONFIG, "reason": LONG_REASON} for i in range(n_waiting)],
        "paused_suites": [],
        "retries": [],
        "events": [{"ts": now, "job": i, "kind": "x", "message": f"event number {i}"} for i in range(n_events)],
    }


def test_dashboard_fits_the_terminal_and_running_jobs_claim_the_rows() -> None:
    for width, height in ((60, 24), (80, 30), (120, 40)):
        console, buffer = terminal(width, height)
        console.print(render_status(snapshot(n_waiting=6, n_running=12, n_events=12), width=width, height=height))
        lines = buffer.getvalue().splitlines()
        assert len(lines) <= height, (width, height, len(lines))
        assert max(len(line) for line in lines) <= width
        shown_running = sum(1 for line in lines if "E1_QKVO_r16" in line and "3/10" in line)
        if shown_running < 12:  # the rest said on one line, and nothing below the running jobs
            assert sum("+" in line and "more running" in line for line in lines) == 1
            assert not any("recent events" in line for line in lines)
        elif any("recent events" in line for line in lines):  # the events come last, the newest kept
            assert any("event number 11" in line for line in lines)
        assert (shown_running < 12) == (height == 24)
        assert (height == 40) <= any("recent events" in line for line in lines)
        assert any(LONG_CONFIG[:16] in line for line in lines)  # running configs readable, not `E1_…`


def five_running_seven_waiting() -> dict[str, Any]:
    snap = snapshot(n_waiting=0, n_running=5, n_events=12)
    for running, seed in zip(snap["running"], (87, 127, 1337, 2024, 7), strict=True):
        running["seed"] = seed
    snap["counts"]["queued"] = 8
    snap["waiting_groups"] = [
        {"reason": "all allowed GPUs at their plan cap", "jobs": 7, "first_id": 20, "last_id": 26},
        {"reason": LONG_REASON, "jobs": 1, "first_id": 30, "last_id": 30},
    ]
    snap["retries"] = [{"ts": time.time(), "job": 3, "from_level": 0, "to_level": 1, "why": "CUDA out of memory"}]
    return snap


def test_the_dashboard_at_80x24_and_100x35_shows_all_five_running_jobs_with_their_seeds() -> None:
    for width, height in ((80, 24), (100, 35)):
        console, buffer = terminal(width, height)
        console.print(render_status(five_running_seven_waiting(), width=width, height=height))
        lines = buffer.getvalue().splitlines()
        assert len(lines) <= height and max(len(line) for line in lines) <= width, (width, height)
        header = next(line for line in lines if " job " in line and " config " in line)
        assert "seed" in header.split() and "step" in header.split() and "loss" in header.split()
        assert "lvl" in header.split()  # the ladder level outlives elapsed and att on a narrow frame
        if width == 80:
            assert "att" not in header.split()
        for job_id, seed in zip(range(100, 105), (87, 127, 1337, 2024, 7), strict=True):
            (row,) = [line for line in lines if f" {job_id} " in line]
            assert f" {seed} " in row and "3/10" in row and "0.500" in row, row
        assert not any("more running" in line for line in lines)
        waiting = [line.strip("│ ") for line in lines if "waiting:" in line]
        assert waiting == ["7 waiting: all allowed GPUs at their plan cap (jobs 20–26)",
                           f"1 waiting: {LONG_REASON} (job 30)"]
        order = [next(i for i, line in enumerate(lines) if title in line)
                 for title in ("running (5)", "─ waiting (8)", "─ retries")]
        assert order == sorted(order)
        if height == 35:
            assert any("event number 11" in line for line in lines)


def test_rows_go_to_running_then_waiting_then_retries_then_events() -> None:
    from orchestrator.cli.status.rich_view import next_limits

    limits: dict[str, int] | None = {"running": 5, "waiting": 3, "retries": 2, "events": 4}
    gave = []
    while limits is not None:
        before = limits
        limits = next_limits(limits)
        if limits is not None:
            gave.append(next(name for name in limits if limits[name] != before[name]))
    assert gave == ["events"] * 4 + ["retries"] * 2 + ["waiting"] * 2 + ["running"] * 4


def test_piped_status_is_whole(orch_inproc: OrchRunner, db_path: Path) -> None:
    assert orch_inproc("submit", "--suite", "E1", "--pairs", "87:glue-tvt_qnli").rc == 0
    out = orch_inproc("status", "--once").stdout
    assert "…" not in out
    assert f"daemon not running for {db_path}" in out


def test_a_paused_suite_is_said_once_not_on_every_waiting_job() -> None:
    snap = snapshot(n_waiting=0, n_running=0, n_events=0)
    snap["counts"]["queued"] = 5
    reason = "3 attempts failed within 30 s of their start in 5 min"
    snap["paused_suites"] = [{"suite": "E1", "reason": reason, "paused_at": time.time(), "queued": 4}]
    snap["waiting"] = [{"id": i, "suite": "E1", "config": f"c{i}", "reason": "suite E1 is paused"} for i in range(4)]
    snap["waiting"].append({"id": 9, "suite": "E5", "config": "other", "reason": LONG_REASON})
    for width, height in ((None, None), (100, 40)):
        console, buffer = terminal(120)
        console.print(render_status(snap, width=width, height=height))
        out = buffer.getvalue()
        assert out.count(reason) == 1 and out.count("paused") == 2  # the panel's title and its one line
        assert "4 queued job(s) wait for it" in out and "orch resume E1" in out
        assert f"1 waiting: {LONG_REASON} (job 9)" in out and "job 0" not in out


def test_rows_cut_too_eagerly_are_given_back_to_the_running_jobs() -> None:
    # seven cards, 14 running, a long queue, retries and events: at 80x24 the running jobs take
    # every row the frame has left, not the one row a coarse cut leaves them
    snap = snapshot(n_waiting=0, n_running=14, n_events=12)
    snap["gpus"] = [{**snap["gpus"][0], "index": i, "uuid": f"GPU-{i}"} for i in range(7)]
    snap["counts"]["queued"] = 50_000
    snap["waiting_groups"] = [{"reason": LONG_REASON, "jobs": 200, "first_id": 1001, "last_id": 1200}]
    snap["retries"] = [{"ts": time.time(), "job": i, "from_level": 0, "to_level": 1, "why": "oom"} for i in range(8)]
    console, buffer = terminal(80, 24)
    console.print(render_status(snap, width=80, height=24))
    lines = buffer.getvalue().splitlines()
    assert 22 <= len(lines) <= 24
    shown = sum(1 for line in lines if "E1_QKVO" in line and "3/10" in line)
    assert shown >= 4 and any(f"+{14 - shown} more running" in line for line in lines)
    assert any("waiting (50000)" in line for line in lines) and any("200 waiting:" in line for line in lines)


MARKUP_NAME = "lr[red]1e-4[/red] [bold]"


def test_a_name_that_looks_like_markup_is_printed_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """rich reads `[…]` as markup in a plain string: a config named so lost its brackets."""
    console, buffer = terminal(200)
    print_jobs([job_row(7, MARKUP_NAME)], wide=True, console=console)
    assert MARKUP_NAME in buffer.getvalue()

    from orchestrator.cli.results import _print_table
    from orchestrator.results.aggregate import ResultRow, aggregate
    from orchestrator.results.selection import choose

    summaries = aggregate(
        [
            ResultRow("E", MARKUP_NAME, "glue_rte", seed, {"accuracy": 0.5}, job=seed)
            for seed in (1, 2)
        ]
    )
    _print_table(summaries, 3, choose(summaries, 3), "(none)")
    assert MARKUP_NAME in capsys.readouterr().out
