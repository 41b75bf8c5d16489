"""`orchestrator.api.Sweep` through the real daemon, tmux, SQLite and sim GPUs: submit a grid,
wait, and read jobs, results and curves as DataFrames and as plain rows; the notebook example
runs as a script."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.api import Sweep
from orchestrator.errors import OrchError, PlanError, UsageError
from tests.e2e_helpers import REPO_ROOT, Orch, orch_env, requires_tmux, wait_until

pytestmark = requires_tmux
pd = pytest.importorskip("pandas")


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path) as env:
        env.write_suite("nb", {"small": {"learning_rate": 0.0001, "sim_seconds": 1.5, "sim_mem_gib": 1}}, mem_gib=1)
        env.write_suite("ns", {"tiny": {"sim_seconds": 1, "sim_mem_gib": 1}}, mem_gib=1, not_science=["sim_seconds"])
        yield env


def test_a_grid_from_python_waited_for_and_read_back_as_dataframes(orch: Orch) -> None:
    sweep = Sweep(orch.db, plans=orch.plans)
    with pytest.raises(PlanError, match="holds several values: use grid="):
        sweep.submit("nb", pairs=["1:glue_rte"], sets={"learning_rate": "1e-4,3e-4"})
    rehearsed = sweep.submit("nb", pairs=["1:glue_rte"], grid={"learning_rate": [1e-4]}, dry_run=True)
    assert str(rehearsed["job"].dtype) == "Int64" and rehearsed["job"].isna().all()  # no float ids
    assert list(rehearsed["state"]) == ["would be queued"]
    queued = sweep.submit("nb", pairs=["1:glue_rte", "2:glue_rte"], grid={"learning_rate": [1e-4, 3e-4]})
    assert list(queued["job"]) == [1, 2, 3, 4] and list(queued["state"]) == ["queued"] * 4
    assert list(queued["setting"]) == ["learning_rate=0.0001"] * 2 + ["learning_rate=0.0003"] * 2
    with pytest.raises(OrchError, match="no daemon runs"):
        sweep.wait()
    orch.start_daemon()
    seen: list[dict[int, str]] = []
    states = sweep.wait(timeout_s=120, poll_s=0.2, on_poll=seen.append)
    assert states == {1: "succeeded", 2: "succeeded", 3: "succeeded", 4: "succeeded"}, [
        j["reason"] for j in sweep.jobs(as_frame=False)
    ]
    assert seen[-1] == states and seen[0] != states  # polled while they ran, until they ended

    jobs = sweep.jobs()
    assert {"job", "suite", "config", "learning_rate", "setting", "seed", "task", "state", "attempt", "level",
            "gpu", "submitted_at", "started_at", "ended_at"} <= set(jobs.columns)
    assert list(jobs["metric"]) == ["test_accuracy"] * 4 and jobs["run_s"].gt(0).all()
    assert str(jobs["gpu"].dtype) == "Int64" and jobs["learning_rate"].tolist() == [1e-4, 1e-4, 3e-4, 3e-4]
    assert (jobs["submitted_at"] <= jobs["started_at"]).all() and (jobs["started_at"] < jobs["ended_at"]).all()

    results = sweep.results()
    assert {"job", "config", "learning_rate", "task", "seed", "state", "counted", "split", "metric", "value",
            "level", "inexact_rungs", "marks", "why"} <= set(results.columns)
    # the sim worker reports val beside test: a row per run, split and metric
    assert len(results) == 8 and set(results["metric"]) == {"accuracy"} and set(results["split"]) == {"test", "val"}
    assert results["learning_rate"].dtype == float and results["counted"].all()
    assert set(results["state"]) == {"succeeded"}
    test = results[results["split"] == "test"]
    assert test.groupby("learning_rate")["value"].count().to_dict() == {1e-4: 2, 3e-4: 2}
    # the notebook's table is the CLI's: its counted rows average to the CLI's mean
    cli = json.loads(orch.run("results", "--suite", "nb", "--json").stdout)
    assert sweep.summary("nb", as_frame=False) == [{**r, "setting": r["overrides_label"], "learning_rate":
                                                    r["overrides"]["learning_rate"]} for r in cli]
    means = test[test["counted"]].groupby("learning_rate")["value"].mean()
    assert [round(means[r["overrides"]["learning_rate"]], 10) for r in cli] == [r["mean"] for r in cli]
    # read once at each attempt's end: the tables no longer need the run dirs
    for result_json in (orch.root / "runs").rglob("result.json"):
        result_json.unlink()
    assert json.loads(orch.run("results", "--suite", "nb", "--json").stdout) == cli
    assert sweep.results("nb").equals(results)

    curves = sweep.curves(keys=["loss"])
    assert list(curves.columns) == ["job", "attempt", "step", "key", "value", "suite", "config", "learning_rate",
                                    "seed", "task", "pruned_step"]
    per_job = curves.groupby("job")["step"].count()
    assert (per_job >= 5).all() and curves["value"].between(0, 2).all()
    assert set(curves["learning_rate"]) == {1e-4, 3e-4} and set(curves["seed"]) == {1, 2}
    rows = sweep.curves(jobs=[1], as_frame=False)
    assert isinstance(rows, list) and rows[0].keys() == {"job", "attempt", "step", "key", "value", "suite", "config",
                                                         "learning_rate", "seed", "task", "pruned_step"}
    assert {r["key"] for r in rows} >= {"loss", "test_accuracy"}
    assert sweep.jobs(as_frame=False)[0]["setting"] == "learning_rate=0.0001"

    # keys a suite calls not science never split a results row
    sweep.submit("ns", pairs="1:glue_rte", sets={"sim_seconds": 1.0})
    sweep.submit("ns", pairs="2:glue_rte", sets={"sim_seconds": 1.5})
    assert set(sweep.wait(timeout_s=120, poll_s=0.2, progress=False).values()) == {"succeeded"}
    assert set(sweep.results("ns")["setting"]) == {""}  # sim_seconds dropped from the setting
    rows = json.loads(orch.run("results", "--suite", "ns", "--json").stdout)
    assert len(rows) == 1 and rows[0]["seeds"] == [1, 2]

    done = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "notebook_sweep.py"), "--db", str(orch.db),
                           "--plans", str(orch.plans), "--suite", "nb", "--pairs", "1:glue_rte 2:glue_rte"],
                          env=orch.env, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "accuracy" in done.stdout and "learning_rate=0.0003" in done.stdout  # nothing new queued, all read back


def test_the_notebook_steers_a_sweep(orch: Orch, monkeypatch: pytest.MonkeyPatch) -> None:
    """start_daemon, cancel, retry, status and stop_daemon from Python, on the CLI's actions."""
    for name, value in orch.env.items():  # the daemon Sweep starts inherits this process's environment
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(orch.root)
    orch.write_suite("slow", {"long": {"sim_seconds": 60, "sim_mem_gib": 1}}, mem_gib=1)
    sweep = Sweep(orch.db, plans=orch.plans)
    sweep.submit("slow", pairs=["1:glue_rte", "2:glue_rte", "3:glue_rte"])
    orch.remember_daemon(sweep.start_daemon(poll_s=0.2))
    with pytest.raises(OrchError, match="already running"):
        sweep.start_daemon()
    wait_until(lambda: sweep.status()["running"] or None, 60, "a job to start")
    status = sweep.status()
    assert status["daemon"]["alive"] and status["counts"].get("running", 0) >= 1
    running = [r["id"] for r in status["running"]]
    queued = [j for j in (1, 2, 3) if j not in running]
    done = sweep.cancel([1, 2, 3])
    assert sorted(done["stopping"]) == sorted(running) and sorted(done["cancelled"]) == sorted(queued)
    wait_until(lambda: set(sweep._states([1, 2, 3]).values()) == {"cancelled"} or None, 60, "the cancels to land")
    again = sweep.retry([3])
    assert again["requeued"] == [3] and sweep._states([3]) == {3: "queued"}
    said = sweep.stop_daemon()
    assert "daemon stopped" in said and not sweep.status()["daemon"]["alive"]
    assert "nothing to stop" in sweep.stop_daemon()


def test_a_not_science_list_changed_between_submits_never_splits_a_row(orch: Orch) -> None:
    """Seeds queued before a suite's not_science named a key kept it in their setting, seeds
    queued after did not: one config, one command, two rows (a --force rerun kept apart too)."""
    orch.write_suite("ac", {"tiny": {"sim_seconds": 1, "sim_mem_gib": 1}}, mem_gib=1)
    orch.submit("ac", "1:toy")
    orch.write_suite("ac", {"tiny": {"sim_seconds": 1, "sim_mem_gib": 1}}, mem_gib=1, not_science=["sim_seconds"])
    orch.submit("ac", "2:toy")
    rows = Sweep(orch.db).summary(as_frame=False)
    assert len(rows) == 1 and rows[0]["n_text"] == "0 of 2 (seeds 1, 2 queued)", rows


def test_wait_returns_ended_jobs_without_a_daemon_and_refuses_nothing_to_wait_for(orch: Orch) -> None:
    """A notebook run again after a kernel restart: a new Sweep knew no job (wait returned {} at
    once), and jobs found already there and ended were refused for want of a daemon."""
    with pytest.raises(UsageError, match="nothing to wait for: this Sweep submitted no job"):
        Sweep(orch.db, plans=orch.plans).wait()
    import sqlite3

    Sweep(orch.db, plans=orch.plans).submit("nb", pairs=["1:glue_rte"])
    with sqlite3.connect(orch.db) as db:  # as a daemon, stopped since, left it
        db.execute("UPDATE jobs SET state = 'succeeded' WHERE id = 1")
    again = Sweep(orch.db, plans=orch.plans)
    again.submit("nb", pairs=["1:glue_rte"])  # found there already: this Sweep's job all the same
    assert again.wait(timeout_s=5, progress=False) == {1: "succeeded"}
