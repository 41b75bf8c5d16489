"""The launch gate: a batch's panes wait until every window of the batch is open."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from orchestrator.executors.launch_gate import GATE_FILE, LaunchGate


def _pane_like(gate: Path, marker: Path) -> subprocess.Popen[bytes]:
    # what a gated pane runs before exec'ing the wrapper
    return subprocess.Popen(["/bin/sh", "-c", f": <'{gate}'; echo started > '{marker}'"])


def test_a_shut_gate_holds_a_pane_until_it_is_released(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "suite" / "job" / "attempt-1"
    run_dir.mkdir(parents=True)
    os.mkfifo(tmp_path / "runs" / ".wake")  # a runs dir a daemon has set up
    gate = LaunchGate()
    path = gate.shut(run_dir)
    assert path == tmp_path / "runs" / GATE_FILE
    marker = tmp_path / "started"
    pane = _pane_like(path, marker)
    try:
        with contextlib.suppress(subprocess.TimeoutExpired):
            pane.wait(timeout=0.5)  # it must not end by itself
        assert pane.poll() is None and not marker.exists()  # held at the gate
        gate.release()
        assert pane.wait(timeout=10) == 0 and marker.read_text() == "started\n"
        later = _pane_like(path, tmp_path / "later")  # held open between batches: no wait
        assert later.wait(timeout=10) == 0
    finally:
        pane.kill()
    gate.shut(run_dir)  # the next batch: shut again, then released again
    gate.release()
    assert _pane_like(path, tmp_path / "again").wait(timeout=10) == 0


def test_a_planted_file_in_the_gates_place_holds_nothing_back(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    assert LaunchGate().shut(runs / "s" / "j" / "attempt-1") is None  # no daemon set this runs dir up
    os.mkfifo(runs / ".wake")
    (tmp_path / "elsewhere").mkdir()
    os.mkfifo(tmp_path / "elsewhere" / "fifo")
    (runs / GATE_FILE).symlink_to(tmp_path / "elsewhere" / "fifo")
    assert LaunchGate().shut(runs / "s" / "j" / "attempt-1") is None
