"""OOM recovery end to end: OOM'd attempts retried down the degradation ladder on sim GPUs."""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import Orch, requires_tmux, wait_until

pytestmark = [requires_tmux, pytest.mark.tmux]

FAKE_OOM_SCRIPT = '''
import os, sys, yaml
config = yaml.safe_load(open(sys.argv[sys.argv.index("--cfg") + 1]))
if not config.get("gradient_checkpointing"):
    print("step 1 loss 2.0")
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
          "GPU 0 has a total capacity of 23.99 GiB of which 1.02 GiB is free.", file=sys.stderr)
    sys.exit(1)
print("trained with checkpointing")
'''




def _config_yaml(attempt: dict[str, Any]) -> dict[str, Any]:
    loaded = yaml.safe_load((Path(attempt["run_dir"]) / "config.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _events(orch: Orch, kind: str) -> list[dict[str, Any]]:
    return [{"job": event.job_id, "data": event.data or {}} for event in orch.events(kind)]


@pytest.mark.slow
def test_underdeclared_jobs_oom_then_succeed_degraded(orch: Orch) -> None:
    # Declared 8 GiB, truly 15 GiB: two fit on a 24 GiB card on paper, not in memory. Two
    # configs, each its own memory family: a family probes one job per card, but the probes of
    # two families that have measured nothing may share a card.
    configs = {f"fat{n}": {"sim_mem_gib": 15 + n / 10} for n in range(2)}
    orch.write_suite("fat", configs, mem_gib=8, one_token_tasks=["glue*"], max_attempts=6)
    orch.submit("fat", " ".join(f"{seed}:glue_rte" for seed in range(1, 5)), "--gpu-plan", "2,2")
    orch.start_daemon()
    states = orch.wait_all_done(150)
    assert set(states.values()) == {"succeeded"}, states

    oomed_jobs: set[int] = set()
    for job_id in states:
        show = orch.json("show", str(job_id))
        attempts = show["attempts"]
        assert len(attempts) <= show["max_attempts"]
        assert [a["outcome"] for a in attempts][-1] == "succeeded"
        for before, after in itertools.pairwise(attempts):
            assert before["outcome"] == "oom", attempts  # only OOMs are retried here
            assert after["level"] > before["level"], attempts
            oomed_jobs.add(job_id)
        rows = orch.attempts(job_id)
        original = _config_yaml(rows[0])
        final = _config_yaml(rows[-1])
        assert final["batch_size"] * final["gradient_accumulation_steps"] == (
            original["batch_size"] * original["gradient_accumulation_steps"]
        )
        if rows[-1]["level"] >= 1:
            assert final["gradient_checkpointing"] is True
            assert final["logits_to_keep"] == 1  # glue_rte is scored on one token
    assert oomed_jobs, "the sweep was meant to overfill a card at level 0"

    # Each OOM event names who else was on the card.
    oom_events = _events(orch, "end:oom")
    assert oom_events
    assert all("neighbours" in e["data"] for e in oom_events)
    assert any(e["data"]["neighbours"] for e in oom_events)

    # Once a shape has succeeded, later attempts of that shape are placed on its measured peak.
    rows = orch.attempts()
    config_of = {job.id: job.config_name for job in orch.jobs()}
    checked = 0
    for row in rows:
        earlier_success = [
            r for r in rows
            if r["outcome"] == "succeeded" and r["level"] == row["level"] and r["ended_at"] < row["started_at"]
            and config_of[r["job_id"]] == config_of[row["job_id"]]
        ]
        if earlier_success:
            assert row["prediction_source"] == "measured", row
            checked += 1
    assert checked >= 1
    sources = [a["prediction_source"] for job_id in states for a in orch.json("show", str(job_id))["attempts"]]
    assert "measured" in sources


@pytest.mark.slow
def test_unfixable_oom_errors_and_foreign_scripts(orch: Orch) -> None:
    script = orch.root / "fake_train.py"
    script.write_text(FAKE_OOM_SCRIPT)
    # Too big for a 24 GiB card at every level: the weights alone take 26 GiB.
    orch.write_suite("huge", {"huge": {"sim_mem_gib": 40, "sim_base_gib": 26}}, mem_gib=8,
                     one_token_tasks=["glue*"], max_attempts=8)
    orch.write_suite("broken", {"broken": {"sim_mem_gib": 2, "sim_fail": "error"}}, mem_gib=3)
    orch.write_suite("foreign", {"foreign": {"batch_size": 4}}, mem_gib=1,
                     worker=f"{sys.executable} {script} --cfg {{config}}")
    orch.submit("huge", "1:glue_rte", "--gpus", "0", "--gpu-plan", "2")
    orch.submit("broken", "1:glue_rte", "--gpus", "1")
    orch.submit("foreign", "1:glue_rte", "--gpus", "1")
    orch.start_daemon()
    states = orch.wait_all_done(120)
    assert states == {1: "failed", 2: "failed", 3: "succeeded"}, states

    huge = orch.json("show", "1")
    outcomes = [a["outcome"] for a in huge["attempts"]]
    assert set(outcomes) == {"oom"}
    assert 2 <= len(outcomes) <= huge["max_attempts"]
    assert [a["level"] for a in huge["attempts"]] == sorted({a["level"] for a in huge["attempts"]})
    assert huge["reason"] and "OOM" in huge["reason"]
    for row in orch.attempts(1):
        config = _config_yaml(row)
        assert config["batch_size"] * config["gradient_accumulation_steps"] == 4

    broken = orch.json("show", "2")
    assert [a["outcome"] for a in broken["attempts"]] == ["failed"]
    assert broken["attempts"][0]["level"] == 0
    assert broken["level"] == 0
    assert "simulated failure" in (broken["reason"] or "") or "simulated failure" in (
        broken["attempts"][0]["reason"] or ""
    )

    foreign = orch.json("show", "3")
    assert [a["outcome"] for a in foreign["attempts"]] == ["oom", "succeeded"]
    assert [a["level"] for a in foreign["attempts"]] == [0, 1]


def test_fast_errors_pause_the_suite(orch: Orch) -> None:
    # Errors are not OOMs: no degradation, no retry; three within seconds pause the suite.
    orch.write_suite("broken", {"broken": {"sim_mem_gib": 1, "sim_seconds": 1, "sim_fail": "error"}}, mem_gib=1)
    orch.submit("broken", "1:a 2:a 3:a", "--gpu-plan", "2,1")
    orch.start_daemon()
    wait_until(lambda: Counter(orch.job_states().values()) == {"failed": 3}, 60, "three failures")
    status = wait_until(lambda: (s := orch.json("status"))["paused_suites"] and s, 10, "the suite paused")
    assert [p["suite"] if isinstance(p, dict) else p for p in status["paused_suites"]] == ["broken"]
    assert all(a["level"] == 0 for a in orch.attempts())
    orch.submit("broken", "4:a")
    job = wait_until(lambda: next((j for j in orch.json("jobs") if j["id"] == 4 and j["wait_reason"]), None),
                     10, "a wait reason on the paused suite's new job")
    assert "paused" in job["wait_reason"]
    assert orch.job_states()[4] == "queued"
    assert not orch.attempts(4)


def test_suite_crash_loop_setting_is_honoured(orch: Orch) -> None:
    # `crash_loop: off`: three fast errors pause nothing; `failures: 1`: the first one pauses.
    failing = {"sim_mem_gib": 1, "sim_seconds": 1, "sim_fail": "error"}
    orch.write_suite("unguarded", {"broken": failing}, mem_gib=1, crash_loop=False)
    orch.write_suite("touchy", {"broken": failing}, mem_gib=1, crash_loop={"failures": 1, "within_s": 20})
    orch.submit("unguarded", "1:a 2:a 3:a", "--gpu-plan", "2,1")
    orch.start_daemon()
    wait_until(lambda: Counter(orch.job_states().values()) == {"failed": 3}, 60, "three failures")
    # Submitted after: the daemon handles one ending at a time, so once this suite is paused the
    # guard has seen every failure of the first.
    orch.submit("touchy", "1:a 2:a")
    status = wait_until(lambda: (s := orch.json("status"))["paused_suites"] and s, 30, "a suite paused")
    assert [(p["suite"], p["reason"]) for p in status["paused_suites"]] == [
        ("touchy", "1 attempt failed within 20 s each in the last 5 min")
    ]
    unguarded = {job.id for job in orch.jobs(suite="unguarded")}
    assert len([a for a in orch.attempt_rows() if a.job_id in unguarded]) == 3


def test_fast_errors_pause_only_their_config_and_the_healthy_one_runs_on(orch: Orch) -> None:
    # One config of the suite fails at once, the other is healthy: the guard pauses the failing
    # config alone, the healthy one runs to the end, and `orch status` says what is paused.
    orch.write_suite("mixed", {"broken": {"sim_mem_gib": 1, "sim_seconds": 1, "sim_fail": "error"},
                               "healthy": {"sim_mem_gib": 1, "sim_seconds": 1}}, mem_gib=1, max_attempts=1)
    orch.submit("mixed", "1:a 2:a 3:a 4:a", "--gpu-plan", "2,1")
    orch.start_daemon()
    status = wait_until(lambda: (s := orch.json("status"))["paused_configs"] and s, 60, "the broken config paused")
    assert [(p["suite"], p["config"]) for p in status["paused_configs"]] == [("mixed", "broken")]
    healthy = {job.id for job in orch.jobs(suite="mixed") if job.config_name == "healthy"}
    wait_until(lambda: all(orch.job_states()[i] == "succeeded" for i in healthy), 60, "the healthy config to finish")
    assert orch.json("status")["paused_suites"] == []
    orch.submit("mixed", "5:a")  # a new job of each config: the broken one waits, the healthy one runs
    states = wait_until(lambda: (s := orch.job_states()) and s.get(10) == "succeeded" and s, 60, "the new healthy job")
    new_broken = next(j for j in orch.jobs(suite="mixed") if j.config_name == "broken" and j.seed == 5)
    assert states[new_broken.id] == "queued" and not orch.attempts(new_broken.id)
    reason = wait_until(lambda: next(j for j in orch.json("jobs") if j["id"] == new_broken.id)["wait_reason"], 10,
                        "the waiting reason of the broken config's new job")
    assert reason == "config broken of suite mixed is paused"
    assert "config broken of suite mixed paused: 3 attempts failed" in orch.run("status", "--once").stdout
