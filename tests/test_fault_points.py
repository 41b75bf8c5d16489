"""A daemon killed inside an attempt's end (its memory learned, the attempt not yet closed, by
the `after_learn` fault point) and restarted: the OOM floor is applied once, not twice."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from e2e_helpers import Orch, group_alive, orch_env, requires_tmux

from orchestrator.store.attempts import read_all_shapes

pytestmark = [requires_tmux, pytest.mark.tmux]

# Held 6 GiB and asked for 2 more: the shape needs at least 8 GiB (8192 MiB). A second
# application of the same OOM would raise the floor by x1.25 to 10240 MiB.
OOM_SCRIPT = '''
import sys
print("step 1 loss 2.0", flush=True)
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
      "of 23.99 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 6.00 GiB "
      "memory in use.", file=sys.stderr)
sys.exit(1)
'''
FLOOR_MIB = 8192


def _daemon_dies_at(orch: Orch, point: str) -> None:
    """Start the daemon with the fault point set; return once it has stopped there and is gone."""
    orch.start_daemon_dying_at(point)


def test_a_daemon_killed_between_learning_and_closing_applies_the_floor_once(tmp_path: Path) -> None:
    with orch_env(tmp_path) as orch:
        script = tmp_path / "oom.py"
        script.write_text(OOM_SCRIPT)
        orch.write_suite("oomy", {"a": {}}, worker=f"{sys.executable} {script} --cfg {{config}}", mem_gib=1,
                         max_attempts=1)
        orch.submit("oomy", "1:glue_rte")

        _daemon_dies_at(orch, "after_learn")
        # nothing of the end was committed: the attempt is open and no memory was learned
        assert [a["outcome"] for a in orch.attempts()] == [None]
        assert orch.read(read_all_shapes) == {}

        orch.start_daemon()
        assert orch.wait_all_done(60) == {1: "failed"}
        attempts = orch.attempts()
        # the script holds its declared 1 GiB on the simulated card from its start (a simulated
        # footprint): whether a sample saw it before the OOM is timing
        assert [(a["outcome"], a["peak_mib"] in (0, 1024)) for a in attempts] == [("oom", True)]
        shapes = [(shape.oom_floor_mib, shape.samples) for shape in orch.read(read_all_shapes).values()]
        assert shapes == [(FLOOR_MIB, 0)], shapes
        ends = [event.kind for event in orch.events() if event.kind.startswith("end:")]
        assert ends == ["end:oom"]


def test_a_daemon_killed_after_marking_an_attempt_hung_kills_and_counts_it_once(tmp_path: Path) -> None:
    with orch_env(tmp_path) as orch:
        orch.write_suite("hang", {"hang": {"sim_mem_gib": 2, "sim_seconds": 2, "sim_fail": "hang"}},
                         mem_gib=3, hang_timeout_s=3)
        orch.submit("hang", "1:a")
        _daemon_dies_at(orch, "after_mark_hung")
        (marked,) = orch.attempts()
        assert marked["kill_requested"] == "hung" and marked["outcome"] is None
        assert group_alive(int(marked["pgid"]))  # the daemon died before it killed the worker

        orch.start_daemon()
        assert orch.wait_all_done(60) == {1: "failed"}
        attempts = orch.attempts(1)  # killed by the restarted daemon, retried once, hung again
        assert [(a["outcome"], a["reason"], a["kill_requested"]) for a in attempts] == [("failed", "hung", "hung")] * 2
        assert len(orch.events("hung")) == 2
        for row in attempts:
            assert row["pgid"] and not group_alive(int(row["pgid"]))
