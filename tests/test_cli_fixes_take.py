"""A fix to a suite file takes: a retry runs the fixed command, and a suite paused for the old
command is resumed by a retry or resubmission that runs another one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.store import Store
from orchestrator.store.endings import pause_suite
from orchestrator.store.queries import get_job
from orchestrator.store.status import paused_suites
from tests.conftest import OrchRunner
from tests.e2e_helpers import orch_env, requires_tmux, wait_until
from tests.test_cli_expectations import one_error_line

TYPO = "python trian.py --seed {seed}"
FIXED = "python train.py --seed {seed}"


def write_suite(plans: Path, worker: str, lr: float = 0.1) -> None:
    (plans / "suites").mkdir(parents=True, exist_ok=True)
    (plans / "configs" / "mine").mkdir(parents=True, exist_ok=True)
    (plans / "configs" / "mine" / "base.yaml").write_text(yaml.safe_dump({"learning_rate": lr}))
    (plans / "suites" / "mine.yaml").write_text(yaml.safe_dump({"worker": worker, "mem_gib": 1, "configs": ["base"]}))


def fail_and_pause(db_path: Path, job_id: int) -> None:
    """What the daemon leaves after a crash loop: the job failed (attempt failed), the suite paused."""
    with Store(db_path) as store:
        with store.write():
            store.execute("UPDATE jobs SET state = 'failed', reason = 'exit code 2' WHERE id = ?", [job_id])
            store.execute(
                "INSERT INTO attempts (job_id, n, level, gpu_index, gpu_uuid, run_dir, started_at, ended_at, outcome, "
                "exit_code, predicted_peak_mib, prediction_source, reserved_mib) "
                "VALUES (?, 1, 0, 0, 'GPU-0', '/nonexistent', 1.0, 2.0, 'failed', 2, 1024, 'declared', 0)", [job_id],
            )
        pause_suite(store, "mine", "3 attempts failed within 30 s of starting", "suite mine paused")


def worker_of(db_path: Path, job_id: int) -> str:
    with Store(db_path) as store:
        return get_job(store, job_id).worker


def paused(db_path: Path) -> list[str]:
    with Store(db_path) as store:
        return [p.suite for p in paused_suites(store)]


@pytest.fixture
def plans(tmp_path: Path) -> Path:
    return tmp_path / "plans"


def test_retry_runs_the_fixed_worker_and_resumes_the_suite(orch_inproc: OrchRunner, db_path: Path, plans: Path) -> None:
    write_suite(plans, TYPO)
    assert orch_inproc("submit", "--suite", "mine", "--pairs", "1:glue_rte").rc == 0
    fail_and_pause(db_path, 1)
    write_suite(plans, FIXED)
    retried = orch_inproc("retry", "1")
    assert retried.rc == 0, retried.stderr
    assert worker_of(db_path, 1) == FIXED
    assert paused(db_path) == []
    assert "resumed, since its worker command changed" in retried.stderr


def test_retry_of_a_changed_config_runs_as_submitted_and_says_how(
    orch_inproc: OrchRunner, db_path: Path, plans: Path
) -> None:
    write_suite(plans, TYPO)
    assert orch_inproc("submit", "--suite", "mine", "--pairs", "1:glue_rte").rc == 0
    fail_and_pause(db_path, 1)
    write_suite(plans, FIXED, lr=0.2)  # another experiment: the retry must not take it silently
    retried = orch_inproc("retry", "1")
    assert retried.rc == 0
    assert worker_of(db_path, 1) == TYPO
    assert "runs as submitted" in retried.stderr and "orch submit --suite mine --pairs 1:glue_rte" in retried.stderr
    assert "`orch resume mine`" in retried.stderr and paused(db_path) == ["mine"]


def test_a_resubmission_of_a_fixed_suite_is_not_held_by_its_old_pause(
    orch_inproc: OrchRunner, db_path: Path, plans: Path
) -> None:
    write_suite(plans, TYPO)
    assert orch_inproc("submit", "--suite", "mine", "--pairs", "1:glue_rte").rc == 0
    fail_and_pause(db_path, 1)
    same = orch_inproc("submit", "--suite", "mine", "--pairs", "2:glue_rte")
    assert "is paused" in same.stderr and "`orch resume mine`" in same.stderr and paused(db_path) == ["mine"]
    write_suite(plans, FIXED)
    fixed = orch_inproc("submit", "--suite", "mine", "--pairs", "1:glue_rte")
    assert fixed.rc == 0 and "resumed" in fixed.stderr
    assert paused(db_path) == []


def test_retrying_a_succeeded_job_points_at_submit_force(orch_inproc: OrchRunner, db_path: Path, plans: Path) -> None:
    write_suite(plans, FIXED)
    assert orch_inproc("submit", "--suite", "mine", "--pairs", "1:glue_rte").rc == 0
    with Store(db_path) as store, store.write():
        store.execute("UPDATE jobs SET state = 'succeeded' WHERE id = 1")
    result = orch_inproc("retry", "1")
    assert result.rc == 2
    assert "orch submit --suite mine --config base --pairs 1:glue_rte --force" in one_error_line(result.stderr)


@requires_tmux
@pytest.mark.slow
def test_a_script_not_found_is_said_and_fixing_the_suite_then_retrying_runs_it(tmp_path: Path) -> None:
    """Real daemon, tmux and sim GPUs: a typo in `worker:` fails with Python's own line, the
    crash-loop guard pauses the suite, and fixing the file then `orch retry --suite` runs it."""
    with orch_env(tmp_path) as orch:
        write_suite(orch.plans, "python trian.py --seed {seed}")
        orch.submit("mine", "1:glue_rte 2:glue_rte 3:glue_rte")
        orch.start_daemon()
        wait_until(lambda: orch.read(paused_suites), 60, "the crash-loop guard to pause the suite")
        wait_until(lambda: set(orch.job_states().values()) == {"failed"}, 60, "every job to fail")
        reason = orch.json("show", "1")["attempts"][0]["reason"]
        assert reason.startswith("exit code 2: ") and "can't open file" in reason and "trian.py" in reason
        (tmp_path / "train.py").write_text("print('trained')\n")
        write_suite(orch.plans, "python train.py --seed {seed}")
        retried = orch.run("retry", "--suite", "mine")
        assert "resumed" in retried.stderr
        assert set(orch.wait_all_done(60).values()) == {"succeeded"}


@pytest.mark.parametrize("knows_plans", [True, False])
def test_the_web_retry_takes_the_suite_file_as_orch_retry_does(
    orch_inproc: OrchRunner, db_path: Path, plans: Path, knows_plans: bool
) -> None:
    pytest.importorskip("starlette", reason="needs the web extra")
    from starlette.testclient import TestClient

    from orchestrator.web.app import create_app

    write_suite(plans, TYPO)
    assert orch_inproc("submit", "--suite", "mine", "--pairs", "1:glue_rte").rc == 0
    fail_and_pause(db_path, 1)
    write_suite(plans, FIXED)
    app = create_app(db_path, "t0ken", plans_dir=plans if knows_plans else None)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        done = client.post("/api/jobs/1/retry", headers={"X-Orch-Token": "t0ken"})
    assert done.status_code == 200 and done.json()["done"] == "requeued"
    assert worker_of(db_path, 1) == (FIXED if knows_plans else TYPO)
    assert paused(db_path) == ([] if knows_plans else ["mine"])


def test_a_tpe_trial_the_daemon_queued_takes_the_suite_and_a_taskless_hint_names_seeds(
    orch_inproc: OrchRunner, db_path: Path, plans: Path
) -> None:
    # the daemon's later trials carry an identity of their own making: their stored config decides
    from orchestrator.actions.suite_changes import take_suite_as_it_is
    from orchestrator.store.search import queue_trial

    (plans / "configs" / "rs").mkdir(parents=True)
    (plans / "suites").mkdir(parents=True, exist_ok=True)
    (plans / "configs" / "rs" / "base.yaml").write_text(yaml.safe_dump({"learning_rate": 0.1, "width": 8}))
    suite = {"worker": "python train.py {config}", "mem_gib": 1, "configs": ["base"],
             "search": {"method": "tpe", "trials": 3, "metric": "accuracy",
                        "space": {"learning_rate": {"log_uniform": [1.0e-5, 1.0e-1]}}}}
    (plans / "suites" / "rs.yaml").write_text(yaml.safe_dump(suite))
    submitted = orch_inproc("submit", "--suite", "rs", "--seeds", "1")
    assert submitted.rc == 0, submitted.stderr
    with Store(db_path) as store:
        [later] = queue_trial(store, [get_job(store, 1)], {"learning_rate": 0.001}, 1)
        assert take_suite_as_it_is(store, later, plans) == (False, None)
        (plans / "configs" / "rs" / "base.yaml").write_text(yaml.safe_dump({"learning_rate": 0.1, "width": 16}))
        changed, said = take_suite_as_it_is(store, later, plans)
    assert not changed and said is not None and "`orch submit --suite rs --seeds 1`" in said, said
