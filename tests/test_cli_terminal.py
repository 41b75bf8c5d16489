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
            "'measured: running, step 10', 0)",
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
    import orchestrator.cli.jobs.command as jobs_module
    from orchestrator.cli.jobs.command import _ts

    assert orch_inproc(*SUBMIT).rc == 0
    add_attempt(db_path, reason="CUDA out of memory [bold]x[/]")
    buffer = on_terminal(monkeypatch, jobs_module, 80)
    assert orch_inproc("show", "1").rc == 0
    out = buffer.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 80
    assert _ts(STARTED_S) in out  # the start date and time on one line, whole
    assert "…" not in out
    assert "[bold]x[/]" in out  # a reason is text, never markup
    assert "measured: running, step 10" in out


OOM_TEXT = ("CUDA out of memory. Tried to allocate 2.00 GiB.\nGPU 0 has a total capacity of 23.65 GiB of which "
            "1.1 GiB is free.\nIncluding non-PyTorch memory, this process has 21.3 GiB memory in use. " * 3)


def status_snapshot_with_an_oom() -> dict[str, Any]:
    from tests.test_output_width import snapshot

    snap = snapshot(n_waiting=2, n_running=2, n_events=3)
    snap["retries"] = [{"ts": STARTED_S, "job": 3, "from_level": 0, "to_level": 1, "why": OOM_TEXT}]
    snap["events"].append({"ts": STARTED_S, "job": 3, "kind": "oom", "message": f"attempt 1 oom: {OOM_TEXT}"})
    return snap


def test_piped_status_is_plain_columns() -> None:
    from orchestrator.cli.status.plain import plain_status

    out = plain_status(status_snapshot_with_an_oom())
    assert not any(ch in out for ch in "│─╭╮╰╯┃━")  # no box drawing
    assert "\x1b" not in out
    lines = out.splitlines()
    assert lines[0].startswith("daemon pid 1") and "queued 2" in lines[0]
    header = next(line for line in lines if line.startswith("job ") and "config" in line and "GPU" in line)
    assert header.split() == ["job", "config", "setting", "seed", "data", "GPU", "SM", "att", "lvl", "elapsed", "step",
                              "loss", "mem/pred"]
    assert sum(1 for line in lines if "Tried to allocate" in line) == 2  # the retry and its event, one line each
    assert any(line.startswith("GPU") and "foreign" in line for line in lines)


def test_piped_status_through_the_command(orch_inproc: OrchRunner, db_path: Path) -> None:
    assert orch_inproc(*SUBMIT).rc == 0
    out = orch_inproc("status", "--once").stdout  # captured: not a terminal
    assert not any(ch in out for ch in "│─╭╮╰╯")
    assert max(len(line) for line in out.splitlines()) < 200
    assert f"daemon not running for {db_path}" in out


def test_a_long_oom_text_takes_one_line_in_the_dashboard() -> None:
    from orchestrator.cli.status.rich_view import render_status

    console = Console(file=io.StringIO(), force_terminal=True, color_system=None, width=100, height=60)
    console.print(render_status(status_snapshot_with_an_oom(), width=100))
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert sum(1 for line in lines if "Tried to allocate" in line) == 2
    assert not any("GPU 0 has a total capacity" in line and "Tried" not in line for line in lines)


def test_gpus_without_nvml_shows_the_daemons_last_reading(
    orch_inproc: OrchRunner, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep run on simulated GPUs, read from a shell without ORCH_GPU_BACKEND: `orch status`
    shows the GPUs from the database, and so does `orch gpus`."""
    import time

    import orchestrator.api.daemon_process as daemon_setup
    from orchestrator.errors import GpuUnavailable
    from orchestrator.store.daemon_row import register_daemon, unregister_daemon, write_heartbeat

    def no_nvml(backend: str | None = None, state_dir: Path | None = None) -> Any:
        raise GpuUnavailable("NVML could not initialise: NVML Shared Library Not Found")

    monkeypatch.setattr(daemon_setup, "make_probe", no_nvml)  # this machine may have NVML: it must not matter
    card = {"index": 1, "uuid": "GPU-sim-1", "name": "sim 24GiB", "total_mib": 24576, "used_mib": 2048,
            "free_mib": 22528, "utilization_pct": None, "processes": [{"pid": 4242, "used_mib": 2048}]}
    with Store(db_path, create=True) as store:
        register_daemon(store, 1, 0.0, time.time(), lambda pid, created: None)
        write_heartbeat(store, time.time(), [card], None)
        unregister_daemon(store, time.time(), "daemon stopped")
    result = orch_inproc("gpus")
    assert result.rc == 0, result.stderr
    assert "GPU 1  sim 24GiB  2.0 GiB used / 24.0 GiB, 22.0 GiB free  GPU-sim-1" in result.stdout
    assert "pid 4242" in result.stdout and "last reading" in result.stderr
    assert json.loads(orch_inproc("gpus", "--json").stdout)[0]["uuid"] == "GPU-sim-1"
    monkeypatch.setenv("ORCH_GPU_BACKEND", "nvml")  # asked for NVML by name: its error, not an old reading
    assert orch_inproc("gpus").rc != 0
