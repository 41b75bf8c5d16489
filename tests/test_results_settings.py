"""A results row is one effective config: runs with different `--set` overrides are never
pooled, every override is named in every format, and no succeeded run is dropped (a seed that
ran twice is counted twice and said so)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.lifecycle import JobState
from orchestrator.store import Store
from orchestrator.store.queries import list_jobs
from tests.conftest import OrchRunner
from tests.e2e_helpers import Orch, orch_env, requires_tmux
from tests.store_reads import read_jobs


def _rows_by_overrides(payload: list[dict]) -> dict[str, dict]:
    return {row["overrides_label"]: row for row in payload}


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Orch]:
    with orch_env(tmp_path) as env:
        yield env


@requires_tmux
def test_a_set_override_makes_its_own_row_and_no_run_is_dropped(live: Orch) -> None:
    # Seeds 1-3 at the config's learning rate, then seeds 1-2 with --set learning_rate=1e-3:
    # pooled by (suite, config, task), this was one cell, n=3, with seeds 1 and 2 of the first dropped.
    live.write_suite("lr", {"c": {"learning_rate": 0.0003, "sim_mem_gib": 1, "sim_seconds": 0.3,
                                  "sim_ramp_s": 0.1}}, mem_gib=1)
    live.submit("lr", "1:glue_rte,2:glue_rte,3:glue_rte")
    live.submit("lr", "1:glue_rte,2:glue_rte", "--set", "learning_rate=1e-3")
    live.start_daemon()
    assert set(live.wait_all_done(90).values()) == {"succeeded"}

    rows = _rows_by_overrides(live.json("results"))
    assert set(rows) == {"", "learning_rate=0.001"}
    assert (rows[""]["n"], rows[""]["seeds"]) == (3, [1, 2, 3])
    assert (rows["learning_rate=0.001"]["n"], rows["learning_rate=0.001"]["seeds"]) == (2, [1, 2])
    assert rows["learning_rate=0.001"]["overrides"] == {"learning_rate": 0.001}
    assert sorted(run["job"] for row in rows.values() for run in row["runs"]) == [1, 2, 3, 4, 5]

    table = live.run("results").stdout
    assert "learning_rate=0.001" in table
    parsed = list(csv.DictReader(io.StringIO(live.run("results", "--csv").stdout)))
    assert sorted((r["overrides"], r["n_seeds"]) for r in parsed) == [("", "3"), ("learning_rate=0.001", "2")]
    markdown = live.run("results", "--format", "markdown").stdout
    assert "| c |" in markdown and "| c \\[learning\\_rate=0.001\\] |" in markdown
    latex = live.run("results", "--format", "latex").stdout
    assert "\nc & " in latex and "\nc [learning\\_rate=0.001] & " in latex


def _succeeded(store: Store, job_id: int, run_dir: Path, result: dict) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "result.json").write_text(json.dumps(result))
    with store.write():
        store.execute(
            "INSERT INTO attempts (job_id, n, level, level_step, gpu_index, gpu_uuid, run_dir, started_at, ended_at, "
            "outcome, overrides_json, predicted_peak_mib, prediction_source, reserved_mib) "
            "VALUES (?, 1, 0, 'as configured', 0, 'GPU-0', ?, 1.0, 2.0, 'succeeded', '{}', 100, 'declared', 0)",
            [job_id, str(run_dir)],
        )
        store.execute("UPDATE jobs SET state = 'succeeded' WHERE id = ?", [job_id])


def _finish_all(db_path: Path, tmp_path: Path) -> None:
    with Store(db_path) as store:
        for job in list_jobs(store, state=JobState.QUEUED.value):
            _succeeded(store, job.id, tmp_path / "runs" / str(job.id),
                       {"status": "ok", "metrics": {"test": {"accuracy": 0.5 + job.id / 100}}})


def test_a_forced_rerun_of_a_seed_replaces_its_value_unless_pooled(
    orch_inproc: OrchRunner, db_path: Path, tmp_path: Path
) -> None:
    demo = ("--suite", "demo", "--round", "all")
    assert orch_inproc("submit", *demo, "--pairs", "1:glue_rte 2:glue_rte").rc == 0
    assert orch_inproc("submit", *demo, "--pairs", "1:glue_rte", "--force").rc == 0  # seed 1 again
    assert orch_inproc("submit", *demo, "--pairs", "1:glue_rte", "--set", "env.EXTRA=1").rc == 0
    _finish_all(db_path, tmp_path)
    payload = json.loads(orch_inproc("results", "--json").stdout)
    small = [row for row in payload if row["config"] == "demo_small"]
    by_label = _rows_by_overrides(small)
    assert set(by_label) == {"", "env.EXTRA=1"}
    plain = by_label[""]
    # n counts distinct seeds: the rerun replaces seed 1's value, it is no second replicate
    assert (plain["n"], plain["seeds"], plain["repeated_seeds"], plain["pooled"]) == (2, [1, 2], {}, False)
    assert plain["denominator"] == {"submitted": 2, "succeeded": 2, "no_metric": 0, "failed": 0, "cancelled": 0,
                                    "running": 0, "queued": 0, "runs": 3, "pruned": 0}
    with Store(db_path) as store:
        seed_one = sorted(j.id for j in read_jobs(store) if j.config_name == "demo_small" and j.seed == 1
                          and not j.overrides)
    assert [run["job"] for run in plain["runs"] if run["seed"] == 1] == [seed_one[-1]]  # the latest run
    assert plain["notes"] == [
        f"seed 1 ran twice (jobs {seed_one[0]}, {seed_one[1]}): the latest, job {seed_one[1]}, counted"
    ]
    values = [run["value"] for run in plain["runs"]]
    assert plain["mean"] == pytest.approx(sum(values) / 2)  # computed from exactly the runs it names
    assert "*" in plain["marks"]
    table = orch_inproc("results").stdout
    assert "seed 1 ran twice" in table and "env.EXTRA=1" in table and "pooled" not in table

    pooled = _rows_by_overrides([r for r in json.loads(orch_inproc("results", "--json", "--pooled").stdout)
                                 if r["config"] == "demo_small"])[""]
    assert (pooled["n"], pooled["seeds"], pooled["repeated_seeds"], pooled["pooled"]) == (3, [1, 1, 2], {"1": 2}, True)
    assert pooled["notes"] == [f"seed 1 ran twice (jobs {seed_one[0]}, {seed_one[1]}): every run counted (pooled)"]
    table = orch_inproc("results", "--pooled").stdout
    assert "1×2 2" in table and "pooled: every succeeded run counted" in table
    markdown = orch_inproc("results", "--format", "markdown", "--pooled").stdout
    assert markdown.startswith("pooled: every succeeded run counted") and "seed 1 ran twice" in markdown
    latex = orch_inproc("results", "--format", "latex").stdout
    assert "seed 1 ran twice" in latex and "env.EXTRA=1" in latex and "pooled" not in latex
    csv_rows = list(csv.DictReader(io.StringIO(orch_inproc("results", "--csv", "--pooled").stdout)))
    small_csv = {r["overrides"]: r for r in csv_rows if r["config"] == "demo_small"}
    assert small_csv[""]["seeds"] == "1 1 2" and small_csv[""]["pooled"] == "true"


def test_web_results_and_report_keep_settings_apart(orch_inproc: OrchRunner, db_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("starlette", reason="needs the web extra")
    from orchestrator.results.collect import RunReader
    from orchestrator.web.report import render_report
    from orchestrator.web.results_view import result_table

    demo = ("--suite", "demo", "--round", "all")
    assert orch_inproc("submit", *demo, "--pairs", "1:glue_rte 2:glue_rte").rc == 0
    assert orch_inproc("submit", *demo, "--pairs", "1:glue_rte", "--set", "learning_rate=1e-3").rc == 0
    _finish_all(db_path, tmp_path)
    with Store(db_path) as store:
        table = result_table(store, RunReader())
        report = render_report(store)
    small = sorted((line.label, line.n_seeds) for line in table.lines if line.config == "demo_small")
    assert small == [("demo_small", 2), ("demo_small [learning_rate=0.001]", 1)]
    assert "demo_small [learning_rate=0.001]" in report


def _own_plans(root: Path, peft: object) -> Path:
    plans = root / "own-plans"
    (plans / "configs" / "lo").mkdir(parents=True)
    (plans / "suites").mkdir()
    (plans / "peft.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "lora_dropout": 0.05}))
    config = {"model": "tiny-llama", "batch_size": 4, "gradient_accumulation_steps": 1, "learning_rate": 3e-4,
              "peft": peft}
    (plans / "configs" / "lo" / "lo.yaml").write_text(json.dumps(config))  # JSON is YAML
    (plans / "suites" / "lo.yaml").write_text(json.dumps({"worker": "sim", "mem_gib": 1, "configs": ["lo"]}))
    return plans


@pytest.mark.parametrize("peft", ["../../peft.json", {"r": 8, "lora_dropout": 0.05}])
def test_validation_as_test_and_dropout_under_mixed_levels_are_marked(
    orch_inproc: OrchRunner, db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, peft: object
) -> None:
    monkeypatch.setenv("ORCH_PLANS", str(_own_plans(tmp_path, peft)))
    assert orch_inproc("submit", "--suite", "lo", "--pairs", "1:glue_rte 2:glue_rte 1:glue_cola").rc == 0
    with Store(db_path) as store:
        jobs = {(j.seed, j.data): j.id for j in list_jobs(store)}
        for (seed, data), job_id in jobs.items():
            run_dir = tmp_path / "runs" / str(job_id)
            metrics = {"accuracy": 0.7 + seed / 10} if data == "glue_rte" else {"mcc": 0.3}
            _succeeded(store, job_id, run_dir, {"status": "ok", "metrics": {"test": metrics},
                                                "test_is_val": data == "glue_cola"})
        # seed 2 on RTE ran at the halved batch: mixed levels, with LoRA dropout on
        with store.write():
            store.execute("UPDATE attempts SET level = 2, overrides_json = ? WHERE job_id = ?",
                          [json.dumps({"batch_size": 2, "gradient_accumulation_steps": 2}), jobs[(2, "glue_rte")]])
    payload = {row["task"]: row for row in json.loads(orch_inproc("results", "--json").stdout)}
    rte, cola = payload["glue_rte"], payload["glue_cola"]
    assert (rte["mixed_levels"], rte["lora_dropout"], rte["dropout_differs"], rte["marks"]) == (True, 0.05, True, ["†"])
    assert (cola["test_is_val"], cola["marks"]) == (True, ["§"]) and cola["runs"][0]["test_is_val"] is True
    assert rte["test_is_val"] is False
    dropout = "went through a ladder rung that changes numerics"
    table = orch_inproc("results").stdout
    assert "0,2 †" in table and "0.3000 ± — §" in table  # one seed: no std
    assert dropout in table and "§ test = validation set" in table
    markdown = orch_inproc("results", "--format", "markdown").stdout
    assert "| 0.3000 ± — § |" in markdown and " †" in markdown  # one seed: no std and no bold
    assert dropout in markdown and "§ test = validation set" in markdown
    latex = orch_inproc("results", "--format", "latex").stdout
    assert "$^{\\dagger}$" in latex and "$^{\\S}$" in latex and "$^\\S$ test = validation set" in latex
    parsed = {r["task"]: r for r in csv.DictReader(io.StringIO(orch_inproc("results", "--csv").stdout))}
    assert (parsed["glue_cola"]["test_is_val"], parsed["glue_rte"]["dropout_differs"]) == ("true", "true")
    from orchestrator.web.report import render_report

    with Store(db_path) as store:
        report = render_report(store)
    assert "§ test = validation set" in report and dropout in report
    assert "mcc §" in report  # the cell's mark, beside its metric


def test_the_dropout_a_run_reports_wins_over_its_config(
    orch_inproc: OrchRunner, db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_PLANS", str(_own_plans(tmp_path, {"r": 8, "lora_dropout": 0.05})))
    assert orch_inproc("submit", "--suite", "lo", "--pairs", "1:glue_rte 2:glue_rte").rc == 0
    with Store(db_path) as store:
        for job in list_jobs(store):
            _succeeded(store, job.id, tmp_path / "runs" / str(job.id),
                       {"status": "ok", "metrics": {"test": {"accuracy": 0.7}}, "lora_dropout": 0.0})
        with store.write():  # seed 2 ran at the halved batch: mixed levels, but the runs drew no dropout
            store.execute("UPDATE attempts SET level = 2, inexact_rungs_json = '[\"halve_batch\"]' WHERE job_id = 2")
    (row,) = json.loads(orch_inproc("results", "--json").stdout)
    assert (row["mixed_levels"], row["lora_dropout"], row["dropout_differs"], row["marks"]) == (True, 0.0, False, ["†"])


def test_runs_of_another_worker_command_or_env_are_not_pooled(
    orch_inproc: OrchRunner, db_path: Path, tmp_path: Path
) -> None:
    demo = ("--suite", "demo", "--round", "all")
    assert orch_inproc("submit", *demo, "--pairs", "1:glue_rte 2:glue_rte 3:glue_rte 4:glue_rte").rc == 0
    with Store(db_path) as store, store.write():  # as `orch retry` leaves jobs after the suite file was edited
        first = min(j.id for j in list_jobs(store) if j.config_name == "demo_small")
        store.execute("UPDATE jobs SET worker = worker || ' --fixed' WHERE id = ?", [first + 1])
        store.execute("UPDATE jobs SET env_json = '{\"TOKENIZERS_PARALLELISM\": \"false\"}' WHERE id = ?", [first + 2])
        store.execute("UPDATE jobs SET env_json = '{\"ORCH_SOMETHING\": \"1\"}' WHERE id = ?", [first + 3])
    _finish_all(db_path, tmp_path)
    small = [row for row in json.loads(orch_inproc("results", "--json").stdout) if row["config"] == "demo_small"]
    assert sorted(row["n"] for row in small) == [1, 1, 2]  # orch's own ORCH_* names do not split a row
    assert sum(len(row["runs"]) for row in small) == 4
