"""A SIGKILL is read for what it is: the kernel's OOM killer (its cgroup's memory.events, or the
kernel log where readable) makes it a host OOM that goes down the host-memory rungs; a SIGKILL
nothing explains, where a checkpoint is left, is a death the job resumes from without counting.

Pure readers and the classifier first, then the watcher's path on a real state.db with the real
wrapper, whose cgroup folder is a fake the test writes (this host has no cgroup v2 to make one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from orchestrator.attempts.classify import REASON_SIGKILL
from orchestrator.attempts.kernel_log import parse_oom_kills
from orchestrator.attempts.next_step import CheckpointLeft, EndEvidence, classify_end, decide_next
from orchestrator.executors.wrapper.oom_events import (
    oom_kill_count,
    oom_kills_since,
    read_oom_kill_count,
)
from orchestrator.executors.wrapper.strays import CGROUP_VAR
from orchestrator.lifecycle import AttemptOutcome, JobState, KillRequest
from orchestrator.rundir_files import TOKEN_VAR
from orchestrator.store import Store
from orchestrator.store.queries import get_attempts, get_job
from tests.test_crash_loop import submit
from tests.test_next_step import LEVELS, a_job
from tests.test_slurm_outcomes import _start
from tests.test_watcher import HereOnly, _watcher

REPO = Path(__file__).resolve().parents[1]
MEMORY_EVENTS = "low 0\nhigh 0\nmax 12\noom 1\noom_kill {}\noom_group_kill 0\n"
SIGKILLED = {"exit_code": 137, "signal": 9, "signal_name": "SIGKILL", "received": [], "forwarded": []}


def test_memory_events_oom_kill_count() -> None:
    assert oom_kill_count(MEMORY_EVENTS.format(3)) == 3
    assert oom_kill_count("low 0\noom 2\n") is None  # no oom_kill line: no word either way
    assert oom_kill_count("oom_kill many\n") is None
    assert oom_kills_since(1, 3) == 2 and oom_kills_since(3, 3) == 0
    assert oom_kills_since(None, 3) is None and oom_kills_since(1, None) is None


def test_memory_events_is_read_from_the_folder_and_never_through_a_link(tmp_path: Path) -> None:
    folder = tmp_path / "cg"
    folder.mkdir()
    assert read_oom_kill_count(str(folder)) is None  # no memory controller there
    (folder / "memory.events").write_text(MEMORY_EVENTS.format(1))
    assert read_oom_kill_count(str(folder)) == 1
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "memory.events").symlink_to(folder / "memory.events")
    assert read_oom_kill_count(str(linked)) is None
    assert read_oom_kill_count("") is None


def test_the_kernel_log_names_the_pids_its_oom_killer_ended_since_a_time() -> None:
    records = [
        "6,100,5000000,-;Out of memory: Killed process 41 (python) total-vm:9000kB, anon-rss:8000kB",
        "6,101,9000000,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=python,pid=42,uid=0",
        "3,102,9100000,-;Memory cgroup out of memory: Killed process 43 (pt_data_worker) total-vm:1kB",
        "6,103,9200000,-;python invoked oom-killer: gfp_mask=0xcc0, order=0, oom_score_adj=0",
        "6,104,9300000,-;Killed process 44 by hand",  # no OOM in it
    ]
    assert parse_oom_kills(records) == {41, 42, 43}
    assert parse_oom_kills(records, since_boot_s=8.0) == {42, 43}  # 41 died before the attempt


def test_a_sigkill_is_a_host_oom_with_the_cgroups_word_and_a_failure_without() -> None:
    bare = EndEvidence(SIGKILLED, None, "step 3/10\n", None)
    assert classify_end(bare).classification.outcome is AttemptOutcome.FAILED
    assert classify_end(bare).classification.reason == REASON_SIGKILL
    for evidence in (replace(bare, exit_record={**SIGKILLED, "oom_kills": 1}), replace(bare, kernel_oom_kill=True)):
        verdict = classify_end(evidence).classification
        assert verdict.outcome is AttemptOutcome.HOST_OOM, evidence
        assert verdict.reason == "killed by the kernel OOM killer (oom_kill event)"
    counted_zero = replace(bare, exit_record={**SIGKILLED, "oom_kills": 0})
    assert classify_end(counted_zero).classification.outcome is AttemptOutcome.FAILED


def test_a_host_oom_from_the_kernel_goes_down_the_host_memory_rungs() -> None:
    verdict = classify_end(EndEvidence({**SIGKILLED, "oom_kills": 1}, None, "", None))
    step = decide_next(a_job(), LEVELS, LEVELS[0], verdict)
    assert step.job_state is JobState.QUEUED and step.next_level == 0 and step.counted
    assert step.retry is not None and step.retry["host_step"]["changes"] == {"num_data_workers": 0}


def test_a_bare_sigkill_with_a_checkpoint_is_a_death_resumed_without_counting() -> None:
    own = CheckpointLeft(attempt_n=1, path="/runs/1/checkpoint-30", progress=True)
    verdict = classify_end(EndEvidence(SIGKILLED, None, "", None, checkpoint=own))
    assert verdict.classification.outcome is AttemptOutcome.LOST and verdict.resumes_from == own
    assert verdict.classification.reason.startswith(REASON_SIGKILL)
    step = decide_next(a_job(max_attempts=1), LEVELS, LEVELS[0], verdict)
    assert step.job_state is JobState.QUEUED and not step.counted
    assert step.job_fields == {"reason": None, "resumes": 1}  # max_attempts does not grow
    assert "resumes from /runs/1/checkpoint-30" in step.why and step.next_level is None

    # the checkpoint is an earlier attempt's: this one got nowhere, so the retry is counted
    earlier = replace(own, attempt_n=1, progress=False)
    verdict = classify_end(EndEvidence(SIGKILLED, None, "", None, checkpoint=earlier))
    assert verdict.classification.outcome is AttemptOutcome.LOST
    assert decide_next(a_job(attempt_count=2), LEVELS, LEVELS[0], verdict).counted
    out_of_attempts = decide_next(a_job(attempt_count=2, max_attempts=2), LEVELS, LEVELS[0], verdict)
    assert out_of_attempts.job_state is JobState.FAILED

    # orch's own kill, or the kernel's OOM kill, is not such a death
    asked = classify_end(EndEvidence(SIGKILLED, None, "", KillRequest.HUNG, checkpoint=own))
    assert asked.resumes_from is None and asked.classification.outcome is AttemptOutcome.FAILED
    oom = classify_end(EndEvidence({**SIGKILLED, "oom_kills": 2}, None, "", None, checkpoint=own))
    assert oom.resumes_from is None and oom.classification.outcome is AttemptOutcome.HOST_OOM


# A worker the kernel OOM-kills: the kernel counts the kill in the cgroup's memory.events, then
# the process is gone by SIGKILL. Here the worker writes the count itself, then kills itself.
OOM_KILLED_WORKER = textwrap.dedent(
    """\
    import os, signal, sys
    print("step 1/10", flush=True)
    if sys.argv[1] == "oom":
        with open(os.path.join(os.environ["ORCH_CGROUP"], "memory.events"), "w") as events:
            events.write({events!r})
    os.kill(os.getpid(), signal.SIGKILL)
    """
).format(events=MEMORY_EVENTS.format(1))


def _run_wrapped(run_dir: Path, cgroup: Path, token: str, how: str) -> None:
    env = {**os.environ, CGROUP_VAR: str(cgroup), TOKEN_VAR: token,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    argv = [sys.executable, "-m", "orchestrator.executors.wrapper.run", "--run-dir", str(run_dir), "--",
            sys.executable, "-c", OOM_KILLED_WORKER, how]  # fmt: skip
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 137, done.stderr


def _sim_suite_s(tmp_path: Path) -> Path:
    """A plans folder with suite `s`: config `a` on the sim worker, 2 data workers, 3 attempts."""
    plans = tmp_path / "plans"
    (plans / "suites").mkdir(parents=True)
    (plans / "configs" / "s").mkdir(parents=True)
    (plans / "configs" / "s" / "a.yaml").write_text(yaml.safe_dump({"sim_mem_gib": 1, "num_data_workers": 2}))
    suite = {"worker": "sim", "mem_gib": 1, "configs": ["a"], "max_attempts": 3}
    (plans / "suites" / "s.yaml").write_text(yaml.safe_dump(suite))
    return plans


@pytest.mark.parametrize("how", ["oom", "bare"])
def test_the_watcher_reads_the_kernels_oom_kill_from_the_attempts_cgroup(
    db_path: Path, tmp_path: Path, how: str
) -> None:
    plans = _sim_suite_s(tmp_path)
    cgroup = tmp_path / "cgroup"  # what the wrapper joins and reads; the test plays the kernel
    cgroup.mkdir()
    (cgroup / "cgroup.procs").write_text("")
    (cgroup / "memory.events").write_text(MEMORY_EVENTS.format(0))
    with Store(db_path) as store:
        (job,) = submit(store, plans, "s", 1)
        attempt = _start(store, job, tmp_path)
        _run_wrapped(Path(attempt.run_dir), cgroup, attempt.token or "", how)
        exit_record = json.loads((Path(attempt.run_dir) / "exit.json").read_text())
        assert exit_record["signal"] == 9 and exit_record["oom_kills"] == (1 if how == "oom" else 0)
        assert _watcher(store, HereOnly(), tmp_path).reconcile(()) == 0
        (ended,) = get_attempts(store, job.id)
        requeued = get_job(store, job.id)
    if how == "oom":
        assert ended.outcome is AttemptOutcome.HOST_OOM, ended.reason
        assert ended.reason == "killed by the kernel OOM killer (oom_kill event)"
        assert requeued.state is JobState.QUEUED and requeued.level == 0  # GPU side unchanged
        assert [step["changes"] for step in json.loads(requeued.host_steps_json or "[]")] == [{"num_data_workers": 0}]
    else:  # the sim worker keeps no checkpoint: nothing to resume, and nothing says OOM
        assert ended.outcome is AttemptOutcome.FAILED and ended.reason == REASON_SIGKILL
        assert requeued.state is JobState.FAILED


def test_a_worker_started_through_a_shell_is_read_as_sigkilled(
    db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell between wrapper and worker reports the worker's SIGKILL as exit code 137 with no
    signal: the kernel log is still consulted, so the kernel's OOM kill is a host OOM."""
    import orchestrator.attempts.outcomes as outcomes

    asked: list[list[int]] = []

    def kernel_log_names(pids: list[int], since: object) -> bool:  # this host's kernel log is not readable
        asked.append(pids)
        return True

    monkeypatch.setattr(outcomes, "kernel_oom_killed", kernel_log_names)
    plans = _sim_suite_s(tmp_path)
    with Store(db_path) as store:
        (job,) = submit(store, plans, "s", 1)
        attempt = _start(store, job, tmp_path)
        worker = tmp_path / "worker.py"
        worker.write_text(OOM_KILLED_WORKER)
        env = {**os.environ, TOKEN_VAR: attempt.token or "",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}  # fmt: skip
        env.pop(CGROUP_VAR, None)
        # "; exit $?" keeps the shell from exec-ing the worker: it stays between, as a launch script does
        argv = [sys.executable, "-m", "orchestrator.executors.wrapper.run", "--run-dir", attempt.run_dir, "--",
                "sh", "-c", f'"{sys.executable}" "{worker}" bare; exit $?']  # fmt: skip
        done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 137, done.stderr
        exit_record = json.loads((Path(attempt.run_dir) / "exit.json").read_text())
        assert exit_record["exit_code"] == 137 and exit_record["signal"] is None
        assert _watcher(store, HereOnly(), tmp_path).reconcile(()) == 0
        (ended,) = get_attempts(store, job.id)
    assert asked, "the kernel log was never consulted"
    assert ended.outcome is AttemptOutcome.HOST_OOM, ended.reason
