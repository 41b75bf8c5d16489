"""A cancel or retry that comes after the worker has already ended (the daemon was stopped, so
the job is still recorded as running): the attempt's own end is read first. A success is kept by
a cancel and refused by a retry (which names `submit --force`); a failure is not retried as if
the request had stopped it. Real daemon, tmux, sim GPUs."""

from __future__ import annotations

import shlex
import sys

import pytest
from e2e_helpers import Orch, requires_tmux, wait_until

from orchestrator.rundir_files import RunDir

pytestmark = [requires_tmux, pytest.mark.tmux]




WORKER = """
import json, os, sys, time
gate, code = sys.argv[1], int(sys.argv[2])
while not os.path.exists(gate):  # ends only once the test lets it: after the daemon is stopped
    time.sleep(0.05)
print(json.dumps({"test": {"accuracy": 0.5}}), flush=True)
sys.exit(code)
"""


def _worker_ended_unseen(orch: Orch, exit_code: int) -> None:
    """Job 1 running, the daemon stopped (workers keep running), then the worker ends on its own."""
    script, gate = orch.root / "worker.py", orch.root / "gate"
    script.write_text(WORKER)
    worker = shlex.join([sys.executable, str(script), str(gate), str(exit_code)])
    orch.write_suite("late", {"late": {}}, worker=worker, mem_gib=1, max_attempts=1)
    orch.submit("late", "1:glue_rte")
    orch.start_daemon()
    attempt = wait_until(lambda: next((a for a in orch.live_attempts() if a.pgid), None), 30, "the worker to start")
    wait_until(lambda: RunDir(attempt.run_dir).pid.exists(), 30, "the wrapper to record itself")
    orch.stop_daemon()
    gate.touch()
    wait_until(lambda: RunDir(attempt.run_dir).exit.exists(), 30, "the worker to end while no daemon watches")
    assert orch.job_states() == {1: "running"}


def test_retry_of_a_running_job_whose_worker_succeeded_is_refused_and_keeps_it(orch: Orch) -> None:
    _worker_ended_unseen(orch, 0)
    proc = orch.run("retry", "1", check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "already succeeded" in proc.stderr
        and "--force" in proc.stderr
        and len(proc.stderr.strip().splitlines()) == 1
    )
    orch.start_daemon()
    assert orch.wait_all_done(30) == {1: "succeeded"}
    assert [a["outcome"] for a in orch.json("show", "1")["attempts"]] == ["succeeded"]


def test_cancel_of_a_running_job_whose_worker_succeeded_keeps_its_result(orch: Orch) -> None:
    _worker_ended_unseen(orch, 0)
    said = orch.json("cancel", "1")
    assert said["finished"] == [1] and said["stopping"] == []
    orch.start_daemon()
    assert orch.wait_all_done(30) == {1: "succeeded"}
    shown = orch.json("show", "1")
    assert [a["outcome"] for a in shown["attempts"]] == ["succeeded"]
    assert orch.json("results")  # the result is there to be read


def test_cancel_of_a_running_job_whose_worker_failed_keeps_its_outcome(orch: Orch) -> None:
    _worker_ended_unseen(orch, 1)
    assert orch.json("cancel", "1")["stopping"] == [1]
    orch.start_daemon()
    assert orch.wait_all_done(30) == {1: "cancelled"}
    attempts = orch.json("show", "1")["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed"]  # what really happened, not "cancelled"


def test_retry_of_a_running_job_whose_worker_failed_runs_it_again(orch: Orch) -> None:
    _worker_ended_unseen(orch, 1)
    assert orch.json("retry", "1")["restarting"] == [1]
    orch.start_daemon()
    wait_until(lambda: len(orch.attempts(1)) == 2, 30, "a second attempt")
    first = orch.json("show", "1")["attempts"][0]
    assert first["outcome"] == "failed"
