"""Fault injection: workers that corrupt every file of their run dir in every way (bad values,
wrong types, huge, binary, directories, FIFOs, symlinks, a forged pid.json, the run dir itself
swapped for a symlink) run beside normal jobs on the real daemon, tmux and SQLite. Every normal
job succeeds, every hostile job ends, nothing outside the run dirs is touched or signalled, and
the daemon keeps ticking."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from e2e_helpers import Orch, group_alive, requires_tmux, wait_until
from hostile_helpers import hostile_command, start_victim, stop_victim

pytestmark = [requires_tmux, pytest.mark.tmux]

MODES = (
    "pid_str", "pid_huge", "pid_negative", "create_time_str", "pgid_str", "pgid_one", "pid_forged",
    "pid_garbage", "pid_list", "pid_binary", "pid_huge_file", "pid_dir", "pid_fifo", "pid_symlink",
    "exit_str", "exit_dir",
    "result_infinity", "result_1e308", "result_1e400", "result_bigint", "result_metrics_list",
    "result_metrics_str", "result_wrong_types", "result_deep", "result_binary", "result_huge",
    "result_dir", "result_fifo", "result_symlink",
    "progress_step_str", "progress_nan", "progress_binary", "progress_huge_line", "progress_dir",
    "progress_fifo", "progress_symlink",
    "log_symlink", "log_fifo", "log_binary", "rundir_symlink",
)


SIM_GPUS = "2x24GiB"  # the simulated cards of the `orch` fixture (tests/conftest.py)


def test_hostile_workers_beside_normal_jobs(orch: Orch) -> None:
    victim = start_victim()
    # the workers' symlinks point here, not at /etc/passwd, which a test beside this one changes
    # when it adds a Unix user
    canary = orch.db.parent / "canary.txt"
    canary.write_text("root:x:0:0:root:/root:/bin/bash\n")
    canary_before = canary.read_bytes()
    try:
        configs = {
            mode.replace("_", "-"): {
                "corrupt": mode, "hold_s": 1, "victim_pid": victim.pid,
                "victim_create_time": victim.create_time(), "link_target": str(canary),
            }
            for mode in MODES
        }
        orch.write_suite("hostile", configs, worker=hostile_command(), mem_gib=0.25, max_attempts=2,
                         hang_timeout_s=60)
        orch.write_suite("normal", {"normal": {"sim_mem_gib": 1, "sim_seconds": 2}}, mem_gib=1.5)
        orch.run("plan", "set", "12,12")
        orch.submit("hostile", "1:a")
        orch.submit("normal", " ".join(f"{seed}:b" for seed in range(1, 9)))
        orch.start_daemon(poll_s=0.2)
        states = orch.wait_all_done(240)
        normal = {job.id: job.state.value for job in orch.jobs(suite="normal")}
        assert len(normal) == 8 and set(normal.values()) == {"succeeded"}, normal
        assert len(states) == len(MODES) + 8

        # the daemon is alive and still ticking after all of it
        status = orch.json("daemon", "status")
        assert status["alive"] is True
        # a later tick: the heartbeat's time (now minus its age) moves on
        beat_at = time.time() - status["heartbeat_age_s"]
        wait_until(lambda: time.time() - orch.json("daemon", "status")["heartbeat_age_s"] > beat_at + 0.5 or None,
                   60, "a new tick")
        log = Path(str(orch.db) + ".daemon.log").read_text(errors="replace")
        assert "tick failed" not in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]

        # each refused file is named in its attempt's reason
        reasons = " ".join(a["reason"] or "" for a in orch.attempts())
        for needle in ("pid.json: pid must be an integer", "result.json: peak_mem_mib must be",
                       "pid.json is a directory", "result.json is a FIFO", "result.json is a symlink",
                       "progress.jsonl: step must be"):
            assert needle in reasons, needle

        # nothing outside orch was signalled or written through a link
        assert victim.is_running() and group_alive(victim.pid)
        assert canary.read_bytes() == canary_before
        for row in orch.attempts():
            if row["pgid"]:
                assert not group_alive(int(row["pgid"]))
        # `orch results`, `show` and `status` read the same files without a traceback
        for args in (("results", "--json"), ("show", "1", "--json"), ("status", "--json"), ("jobs", "--json")):
            proc = orch.run(*args)
            assert "Traceback" not in proc.stderr
    finally:
        stop_victim(victim)
