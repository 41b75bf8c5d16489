"""Every place that lists jobs shows each job's setting (its `--set` and `--grid` values): the jobs
of a learning-rate grid are told apart in `orch jobs`, `orch status` and the web overview, within
80 columns on a terminal, with the seed kept."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from benchmarks.web_load import build_sweep
from orchestrator.api.status_snapshot import status_snapshot
from orchestrator.cli.jobs.table import print_jobs
from orchestrator.cli.status.rich_view import render_status
from orchestrator.lifecycle import JobState
from orchestrator.store import Store
from orchestrator.store.queries import list_jobs
from orchestrator.wording import fmt_setting, short_keys
from tests.conftest import OrchRunner

RATES = {0: 0.001, 1: 0.003}


def grid_sweep(db_path: Path) -> dict[int, float]:
    """A sweep with running and queued jobs, each at one of two learning rates (its setting)."""
    build_sweep(db_path, 30, running=2, queued=4)
    rates: dict[int, float] = {}
    with Store(db_path) as store, store.write():
        for row in store.query("SELECT id FROM jobs ORDER BY id"):
            rates[row["id"]] = RATES[row["id"] % 2]
            store.execute(
                "UPDATE jobs SET overrides_json = ? WHERE id = ?",
                [json.dumps({"learning_rate": rates[row["id"]], "batch_size": 8}), row["id"]],
            )
    return rates


def terminal(width: int) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(
        width=width, height=60, file=buffer, force_terminal=True, color_system=None
    ), buffer


def test_keys_are_shortened_only_where_no_two_share_a_short_name() -> None:
    names = short_keys(["learning_rate", "lora_rank", "batch_size", "dropout", "env.HF_HOME", "bs"])
    assert names == {
        "learning_rate": "learning_rate",
        "lora_rank": "lora_rank",
        "batch_size": "batch_size",
        "dropout": "dropout",
        "env.HF_HOME": "env.HF_HOME",
        "bs": "bs",
    }
    names = short_keys(["learning_rate", "gradient_accumulation_steps"])
    assert (
        fmt_setting({"learning_rate": 3e-4, "gradient_accumulation_steps": 2}, names)
        == "lr=0.0003 gas=2"
    )
    assert fmt_setting({}) == "-"


def test_orch_jobs_shows_each_jobs_setting_piped_and_as_json(
    db_path: Path, orch_inproc: OrchRunner
) -> None:
    rates = grid_sweep(db_path)
    lines = orch_inproc("jobs").stdout.splitlines()
    assert lines[0].split()[:6] == ["id", "state", "suite", "config", "setting", "seed"]
    for line in lines[1:]:
        cells = line.split()
        assert cells[4] == f"learning_rate={rates[int(cells[0])]},batch_size=8", line
    listed = json.loads(orch_inproc("jobs", "--json").stdout)
    assert {j["id"]: j["overrides"]["learning_rate"] for j in listed} == rates


def test_orch_jobs_on_an_80_column_terminal_keeps_setting_and_seed(db_path: Path) -> None:
    rates = grid_sweep(db_path)
    with Store(db_path) as store:
        rows = list_jobs(store)
    console, buffer = terminal(80)
    print_jobs(rows, console=console)
    out = buffer.getvalue().splitlines()
    assert max(len(line) for line in out) <= 80
    header = out[0].split()
    assert "setting" in header and "seed" in header
    by_id = {
        int(line.split()[0]): line for line in out[1:] if line.split() and line.split()[0].isdigit()
    }
    for job_id, rate in rates.items():
        assert f"lr={rate}" in by_id[job_id], by_id[job_id]
    assert "setting: bs = batch_size, lr = learning_rate" in out


def test_orch_status_shows_the_setting_of_running_and_waiting_jobs(
    db_path: Path, orch_inproc: OrchRunner
) -> None:
    rates = grid_sweep(db_path)
    status = json.loads(orch_inproc("status", "--json").stdout)
    assert status["running"] and status["waiting"]
    for entry in [*status["running"], *status["waiting"], *status["jobs"]]:
        assert entry["overrides"] == {"learning_rate": rates[entry["id"]], "batch_size": 8}
    plain = orch_inproc("status", "--once").stdout  # piped
    running = plain.split("\nrunning\n")[1].split("\n\n")[0].splitlines()
    assert running[0].split()[:4] == ["job", "config", "setting", "seed"]
    assert all(f"learning_rate={rates[int(r.split()[0])]}" in r for r in running[1:])
    waiting = plain.split("\nwaiting\n")[1].split("\n\n")[0].splitlines()
    assert waiting[0].split()[:4] == ["job", "config", "setting", "seed"]
    assert all(
        f"learning_rate={rates[int(w.split()[0])]}" in w for w in waiting[1:] if w[0].isdigit()
    )
    with Store(db_path) as store:
        snapshot = status_snapshot(store, all_jobs=False)
    console, buffer = terminal(80)
    console.print(render_status(snapshot, width=80, height=60))
    frame = buffer.getvalue()
    for r in snapshot["running"]:
        line = next(
            line for line in frame.splitlines() if line.strip("│ ").startswith(f"{r['id']} ")
        )
        assert f"lr={rates[r['id']]}" in line and f" {r['seed']} " in line, line


def test_the_web_overview_shows_the_setting_of_running_and_waiting_jobs(db_path: Path) -> None:
    pytest.importorskip("starlette", reason="needs the web extra")
    from starlette.testclient import TestClient

    from orchestrator.web.app import create_app

    rates = grid_sweep(db_path)
    with Store(db_path) as store:
        running = [r.id for r in list_jobs(store, state=JobState.RUNNING.value)]
        queued = [r.id for r in list_jobs(store, state=JobState.QUEUED.value)]
    with TestClient(create_app(db_path, "t0ken"), base_url="http://127.0.0.1:8765") as client:
        page = client.get("/").text
    for job_id in [*running, *queued]:
        row = page.split(f'data-job="{job_id}"')[1].split("</tr>")[0]
        assert f"<code>learning_rate={rates[job_id]}</code>" in row, row


def test_the_live_frame_names_the_setting_of_each_job_of_a_small_waiting_group() -> None:
    from orchestrator.cli.status.lines import waiting_group_lines

    waiting = [
        {
            "id": 9,
            "reason": "all allowed GPUs at their plan cap",
            "overrides": {"learning_rate": 0.001},
        },
        {
            "id": 10,
            "reason": "all allowed GPUs at their plan cap",
            "overrides": {"learning_rate": 0.003},
        },
    ]
    snapshot = {
        "waiting": waiting,
        "counts": {"queued": 2},
        "paused_suites": [],
        "paused_configs": [],
        "waiting_groups": [
            {"reason": waiting[0]["reason"], "jobs": 2, "first_id": 9, "last_id": 10}
        ],
    }
    assert waiting_group_lines(snapshot) == [
        "2 waiting: all allowed GPUs at their plan cap (jobs 9–10: 9 lr=0.001, 10 lr=0.003)"
    ]
    for entry in waiting:
        entry["overrides"] = {}
    assert waiting_group_lines(snapshot) == [
        "2 waiting: all allowed GPUs at their plan cap (jobs 9–10)"
    ]
