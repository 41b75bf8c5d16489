"""The demo shows what it says: its jobs' curves are different lines (the simulator's loss
depends on the config and the seed), and its live dashboard's last frame is the sweep's end."""

from __future__ import annotations

import io
import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from benchmarks.web_load import build_sweep
from orchestrator.api.status_snapshot import status_snapshot
from orchestrator.cli import demo
from orchestrator.store import Store
from tests.conftest import REPO_ROOT
from workers.sim_curves import sim_loss

DEMO_CONFIGS = sorted((REPO_ROOT / "plans" / "configs" / "demo").glob("*.yaml"))


def test_the_demos_twelve_jobs_draw_twelve_lines() -> None:
    curves = set()
    for path in DEMO_CONFIGS:
        config = {**yaml.safe_load(path.read_text()), "data": "glue_rte"}
        for seed in (1, 2, 3, 4):
            curves.add(tuple(sim_loss(step, config, seed) for step in range(1, 41)))
    assert len(DEMO_CONFIGS) == 3 and len(curves) == 12
    for curve in curves:  # a loss that falls, from about 2
        assert 1.0 < curve[0] <= 2.0 and all(a > b for a, b in itertools.pairwise(curve))


def test_an_exact_retry_reports_the_same_curve() -> None:
    config = {**yaml.safe_load(DEMO_CONFIGS[0].read_text()), "data": "glue_rte"}
    retried = {**config, "gradient_checkpointing": True, "batch_size": 2}
    assert [sim_loss(s, config, 1) for s in range(20)] == [
        sim_loss(s, retried, 1) for s in range(20)
    ]


def test_the_last_frame_is_the_sweeps_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    running_db, done_db = tmp_path / "running" / "state.db", tmp_path / "done" / "state.db"
    for path, running in ((running_db, 1), (done_db, 0)):
        path.parent.mkdir()
        build_sweep(path, 12, running=running, queued=0)
    with Store(running_db) as store:
        running_snapshot = status_snapshot(store, all_jobs=False)
    with Store(done_db) as store:
        done_snapshot = status_snapshot(store, all_jobs=False)
    frames = {"read": 0}

    def snapshot(store: Any, all_jobs: bool = True) -> dict[str, Any]:
        frames["read"] += 1
        # the last job ends just after the second frame was read
        return running_snapshot if frames["read"] <= 2 else done_snapshot

    monkeypatch.setattr(demo, "status_snapshot", snapshot)
    monkeypatch.setattr(demo, "_done", lambda store: frames["read"] >= 2)
    monkeypatch.setattr(demo.time, "sleep", lambda s: None)
    buffer = io.StringIO()
    console = Console(width=100, height=40, file=buffer, force_terminal=True, color_system=None)
    demo._watch_live(None, console, deadline=demo.time.monotonic() + 30)  # type: ignore[arg-type]
    last = buffer.getvalue().rsplit("daemon", 1)[-1]
    assert "running (1)" not in last and "succeeded 12" in last, last
