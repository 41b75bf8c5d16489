"""Errors that say where to look: the plans folder, the suite file and line, the way out."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.plans.suite import shipped_plans_dir
from tests.conftest import OrchRunner
from tests.test_cli_expectations import one_error_line


def plans_with(tmp_path: Path, suite_text: str) -> Path:
    plans = tmp_path / "plans"
    (plans / "suites").mkdir(parents=True)
    (plans / "configs" / "mine").mkdir(parents=True)
    (plans / "configs" / "mine" / "a.yaml").write_text(yaml.safe_dump({"sim_mem_gib": 1}))
    (plans / "suites" / "mine.yaml").write_text(suite_text)
    return plans


def submit(orch_inproc: OrchRunner, suite: str, *extra: str) -> str:
    result = orch_inproc("submit", "--suite", suite, "--pairs", "1:glue_rte", *extra)
    assert result.rc == 2, result.stdout
    return one_error_line(result.stderr)


def test_a_plans_folder_that_does_not_exist_is_named(orch_inproc: OrchRunner, db_path: Path) -> None:
    line = submit(orch_inproc, "demo", "--plans", "/nonexistent/plans")
    assert "the plans folder /nonexistent/plans does not exist" in line
    assert not db_path.exists()


def test_a_missing_mem_gib_is_said_to_be_required(orch_inproc: OrchRunner, tmp_path: Path) -> None:
    plans_with(tmp_path, "worker: sim\nconfigs: [a]\n")
    assert "`mem_gib` is required" in submit(orch_inproc, "mine")


def test_a_yaml_error_names_its_file_and_line(orch_inproc: OrchRunner, tmp_path: Path) -> None:
    plans = plans_with(tmp_path, "worker: sim\nconfigs: [a]\nmem_gib: 3\n  oops: : x\n")
    line = submit(orch_inproc, "mine")
    assert str(plans / "suites" / "mine.yaml") in line and "line 4, column" in line


def test_a_suite_given_as_a_path_gets_the_name_and_folder(orch_inproc: OrchRunner, tmp_path: Path) -> None:
    plans_with(tmp_path, "worker: sim\nconfigs: [a]\nmem_gib: 3\n")
    line = submit(orch_inproc, str(tmp_path / "plans" / "suites" / "mine.yaml"))
    assert f"--suite mine --plans {tmp_path / 'plans'}" in line
    assert "--suite mine" in submit(orch_inproc, "mine.yaml")


def test_a_local_plans_folder_that_hides_a_shipped_suite_says_so(orch_inproc: OrchRunner, tmp_path: Path) -> None:
    plans_with(tmp_path, "worker: sim\nconfigs: [a]\nmem_gib: 3\n")  # ./plans in the working folder
    line = submit(orch_inproc, "demo")
    assert f"in {tmp_path / 'plans' / 'suites'}" in line
    assert (
        f"suite demo ships with orch, but {tmp_path / 'plans'} is read instead: --plans {shipped_plans_dir()}"
        in line
    )


def test_the_demos_closing_hint_names_the_job_that_ran_out_of_memory(orch_inproc: OrchRunner, db_path: Path) -> None:
    from orchestrator.cli.demo import closing_hint
    from orchestrator.store import Store
    from orchestrator.store.queries import first_oom_job

    assert orch_inproc("submit", "--suite", "demo", "--pairs", "1:glue_rte").rc == 0
    with Store(db_path) as store:
        assert first_oom_job(store) is None
        with store.write():
            for job_id, outcome, ended in ((2, "succeeded", 5.0), (3, "oom", 7.0), (1, "oom", 9.0)):
                store.execute(
                    "INSERT INTO attempts (job_id, n, level, gpu_index, gpu_uuid, run_dir, started_at, ended_at, "
                    "outcome, predicted_peak_mib, prediction_source, reserved_mib) "
                    "VALUES (?, 1, 0, 0, 'GPU-0', '/nonexistent', 1.0, ?, ?, 1024, 'declared', 0)",
                    [job_id, ended, outcome],
                )
        oom_job = first_oom_job(store)
    assert oom_job == 3
    counts = {"succeeded": 3, "failed": 0, "cancelled": 0}
    assert "orch show 3 --db " in closing_hint(counts, oom_job, db_path)
    assert "ran out of memory" in closing_hint(counts, oom_job, db_path)
    assert "orch show 1 --db " in closing_hint(counts, None, db_path)


def test_the_too_big_for_tmux_hint_names_the_way_out_that_works() -> None:
    from orchestrator.executors.tmux import MAX_ARG_BYTES, too_big_for_tmux

    huge = too_big_for_tmux(7, ["python", "t.py", "--notes", "x" * 900_000], 900_100, 500, "orch-x")
    assert "job 7" in huge and "through {config}" in huge
    assert "--launcher subprocess" not in huge  # no process takes a 900 KB argument: not a way out
    assert "tmux -L" not in huge
    big = too_big_for_tmux(7, ["python", "t.py", "--notes", "x" * 20_000], 20_100, 500, "orch-x")
    assert "through {config}" in big and "orch daemon start --launcher subprocess" in big
    assert MAX_ARG_BYTES > 20_000
    env = too_big_for_tmux(7, ["python", "t.py"], 100, 20_000, "orch-x")
    assert "most of it environment" in env and "tmux -L orch-x kill-server" in env
