"""orch's own shortages never count against a job nor pause its suite: a daemon whose file
descriptor limit (`ulimit -n`) is reached while it launches requeues those attempts uncounted,
and they start once descriptors are free again. Real daemon, tmux, state.db, sim GPUs."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest
from e2e_helpers import Orch, requires_tmux, wait_until

from orchestrator.store.status import paused_suites

pytestmark = [requires_tmux, pytest.mark.tmux]
NOFILE = 20  # enough for the daemon at rest, too few for every launch of a full pass




def _start_with_few_descriptors(orch: Orch) -> None:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "daemon", "start", "--poll", "0.2"], env=orch.env,
                          cwd=orch.root, capture_output=True, text=True, timeout=60, preexec_fn=limit)
    assert proc.returncode == 0, proc.stderr
    orch.remember_daemon(int(orch.json("daemon", "status")["pid"]))


def test_too_many_open_files_fails_no_job_and_pauses_no_suite(orch: Orch) -> None:
    jobs = 16
    orch.write_suite("f", {"f": {"sim_mem_gib": 0.5, "sim_seconds": 2}}, mem_gib=0.6, max_attempts=1)
    orch.submit("f", " ".join(f"{seed}:glue_rte" for seed in range(jobs)), "--gpu-plan", "8,8")
    _start_with_few_descriptors(orch)
    done = orch.wait_all_done(240)
    assert done == {job: "succeeded" for job in range(1, jobs + 1)}
    short = [a for a in orch.attempts() if a["outcome"] == "lost"]
    # the shortage happened (every job still succeeded with max_attempts 1: none was counted)
    assert any("Too many open files" in (a["reason"] or "") for a in short), [a["reason"] for a in short]
    assert orch.read(paused_suites) == []
    wait_until(lambda: orch.daemon_pid() is not None, 5, "the daemon still running")
