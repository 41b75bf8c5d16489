"""Per-job GPU use: where NVML has per-process utilisation, each running job's share of its
card's SMs is read (the latest sample of each of its processes), kept on its attempt and shown
in `orch status` beside the card's figure; `-` where there is none (simulated GPUs)."""

from __future__ import annotations

import io
import os
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from rich.console import Console

from orchestrator.attempts.resource_use import ResourceTracker
from orchestrator.cli.status.lines import RUNNING_COLUMNS, running_cells
from orchestrator.cli.status.plain import plain_status
from orchestrator.cli.status.rich_view import render_status
from orchestrator.gpu.nvml import NvmlProbe
from orchestrator.gpu.snapshot import GpuSnapshot, ProcessMemory
from tests.rows_helpers import attempt_of
from tests.test_gpu_nvml import FakeNvml


class UtilisationNvml(FakeNvml):
    """Card 0 has per-process samples (pid 100: two samples, the later one counts; pid 999 ran
    no kernel lately); card 1 has none (not supported there)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked_since: list[tuple[int, int]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().install(monkeypatch)
        monkeypatch.setattr(
            pynvml, "nvmlDeviceGetProcessUtilization", self.nvmlDeviceGetProcessUtilization
        )

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        extra = [SimpleNamespace(pid=999, usedGpuMemory=1024 * 1024 * 1024)] if handle == 0 else []
        return super().nvmlDeviceGetComputeRunningProcesses(handle) + extra

    def nvmlDeviceGetProcessUtilization(self, handle: int, since_us: int) -> list[Any]:
        self.asked_since.append((handle, since_us))
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [
            SimpleNamespace(pid=100, smUtil=20, memUtil=5, timeStamp=1_000),
            SimpleNamespace(pid=100, smUtil=64, memUtil=9, timeStamp=2_000),
        ]


def test_nvml_per_process_sm_is_read_where_the_card_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = UtilisationNvml()
    fake.install(monkeypatch)
    probe = NvmlProbe()
    gpu0, gpu1 = probe.snapshot()
    assert {p.pid: p.sm_pct for p in gpu0.processes} == {100: 64, 999: 0}
    assert all(p.sm_pct is None for p in gpu1.processes)  # not supported: not known, never 0
    assert gpu0.sm_of({100, 999}) == 64 and gpu1.sm_of({202}) is None
    probe.snapshot()
    assert (0, 2_000) in fake.asked_since  # the next reading asks only for newer samples
    assert gpu0.to_json()["processes"][0]["sm_pct"] == 64


def test_the_attempt_keeps_its_trees_share_of_the_card() -> None:
    card = GpuSnapshot(
        0,
        "GPU-x",
        "card",
        24576,
        6000,
        18576,
        80,
        (ProcessMemory(os.getpid(), 4000, 30), ProcessMemory(4242, 2000, 50)),
    )
    tracker = ResourceTracker(None)
    attempt = attempt_of(gpu_uuid="GPU-x", held_mib=4000)
    assert tracker.fields(attempt, [os.getpid()], {"GPU-x": card}, host_due=False)["sm_pct"] == 30
    unknown = GpuSnapshot(
        0, "GPU-x", "card", 24576, 6000, 18576, None, (ProcessMemory(os.getpid(), 4000),)
    )
    assert "sm_pct" not in tracker.fields(
        attempt, [os.getpid()], {"GPU-x": unknown}, host_due=False
    )


def snapshot(sm_pct: int | None) -> dict[str, Any]:
    running = {
        "id": 7,
        "suite": "s",
        "config": "c",
        "overrides": {},
        "seed": 1,
        "data": "d",
        "gpu": 0,
        "attempt": 1,
        "level": 0,
        "elapsed_s": 3.0,
        "held_mib": 1024,
        "predicted_mib": 2048,
        "sm_pct": sm_pct,
        "progress": {"step": 5, "loss": 0.25},
        "executor": "tmux",
    }
    gpu = {
        "index": 0,
        "uuid": "GPU-x",
        "name": "card",
        "total_mib": 24576,
        "used_mib": 1024,
        "orch_mib": 1024,
        "foreign_mib": 0,
        "free_mib": 23552,
        "utilization_pct": 80 if sm_pct is not None else None,
        "slots": 2,
        "running": 1,
    }
    return {
        "db": "state.db",
        "daemon": {"alive": True, "pid": 1, "draining": False, "last_tick_age_s": 0.5},
        "gpus": [gpu],
        "host": None,
        "disk": None,
        "counts": {"queued": 0, "running": 1, "succeeded": 0, "failed": 0, "cancelled": 0},
        "running": [running],
        "waiting": [],
        "waiting_groups": [],
        "paused_suites": [],
        "paused_configs": [],
        "retries": [],
        "events": [],
        "jobs": [],
    }


def test_status_shows_each_jobs_sm_beside_the_cards_use() -> None:
    assert running_cells(snapshot(37)["running"][0])[RUNNING_COLUMNS.index("SM")] == "37%"
    assert running_cells(snapshot(None)["running"][0])[RUNNING_COLUMNS.index("SM")] == "-"
    plain = plain_status(snapshot(37))
    assert "80%" in plain and "37%" in plain
    buffer = io.StringIO()
    Console(width=80, file=buffer, force_terminal=True, color_system=None).print(
        render_status(snapshot(37), width=80, height=40)
    )
    frame = buffer.getvalue()
    header = next(line for line in frame.splitlines() if " job " in line and "config" in line)
    assert "SM" in header.split() and "37%" in frame
    buffer = io.StringIO()
    Console(width=80, file=buffer, force_terminal=True, color_system=None).print(
        render_status(snapshot(None), width=80, height=40)
    )
    header = next(
        line for line in buffer.getvalue().splitlines() if " job " in line and "config" in line
    )
    assert "SM" not in header.split()  # simulated GPUs: no per-job figure, no empty column


def test_the_web_overview_shows_each_running_jobs_sm_and_the_cards_use(tmp_path: Any) -> None:
    pytest.importorskip("starlette", reason="needs the web extra")
    from starlette.testclient import TestClient

    from benchmarks.web_load import build_sweep
    from orchestrator.store import Store
    from orchestrator.web.app import create_app

    db_path = tmp_path / "state.db"
    build_sweep(db_path, 10, running=2, queued=0)
    with Store(db_path) as store, store.write():
        running = [
            r["id"]
            for r in store.query("SELECT id FROM attempts WHERE outcome IS NULL ORDER BY id")
        ]
        store.execute("UPDATE attempts SET sm_pct = 42 WHERE id = ?", [running[0]])
    with TestClient(create_app(db_path, "t0ken"), base_url="http://127.0.0.1:8765") as client:
        page = client.get("/").text
    cells = [c.split("</td>")[0] for c in page.split('<td class="num sm">')[1:]]
    assert sorted(cells) == ["-", "42%"]  # a job without NVML's figure reads `-`, never 0
    assert '<td class="num util">' in page
