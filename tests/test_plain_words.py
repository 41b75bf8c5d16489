"""Words a first week runs into, said once and as the CLI says them: an attempt's end without
`cancelled; cancelled`, a step without a total, the GPU a finished job ran on, `orch memory` one
line per shape (keys behind `--keys`), and on the web page YAML values (`true`, not `True`) and
final metrics each once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.cli.status.lines import running_cells, step_cell
from orchestrator.prediction.memory import shape_key
from orchestrator.results.collect import job_metrics
from orchestrator.store import Store
from orchestrator.store.rows import ShapeMemory
from orchestrator.wording import ended_on_gpu
from tests.conftest import OrchRunner


def test_an_attempts_end_says_each_thing_once() -> None:
    assert ended_on_gpu(1, "cancelled", 0, "cancelled", "cancelled") == "attempt 1 cancelled on GPU 0"
    assert ended_on_gpu(2, "oom", 1, "CUDA out of memory", "retry at level 1") == (
        "attempt 2 oom on GPU 1: CUDA out of memory; retry at level 1")
    assert (
        ended_on_gpu(3, "failed", 0, "exit code 1: boom", "exit code 1: boom")
        == "attempt 3 failed on GPU 0: exit code 1: boom"
    )
    assert ended_on_gpu(4, "lost", None, "", "requeued") == "attempt 4 lost: requeued"


def test_a_step_without_a_total_is_shown() -> None:
    assert step_cell({"step": 12, "loss": 0.3}) == "12"
    assert step_cell({"step": 12, "total": 40}) == "12/40"
    assert step_cell({"loss": 0.3}) == "-" and step_cell({"step": True}) == "-" and step_cell({"step": "7"}) == "-"
    running = {"id": 1, "config": "c", "seed": 1, "data": "d", "gpu": 0, "attempt": 1, "level": 0, "elapsed_s": 3.0,
               "held_mib": 1024, "predicted_mib": 2048, "progress": {"step": 5, "loss": 0.25}}
    cells = running_cells(running)
    assert cells[10:12] == ["5", "0.250"]
    assert cells[12] == "1.0/2.0G"
    # started on trial under --mps: the fence it may not grow past is named beside its prediction
    assert running_cells(running | {"trial_fence_mib": 1536})[12] == "1.0/2.0G, fence 1.5G"


def _finish(db_path: Path, job_id: int, gpu: int, *, state: str) -> None:
    with Store(db_path) as store, store.write():
        store.execute(
            "INSERT INTO attempts (job_id, n, gpu_index, gpu_uuid, level, run_dir, "
            "predicted_peak_mib, prediction_source, reserved_mib, started_at, ended_at, outcome) "
            "VALUES (?, 1, ?, ?, 0, 'run', 1024, 'declared', 0, 1.0, 2.0, ?)",
            [job_id, gpu, f"GPU-{gpu}", "succeeded" if state == "succeeded" else "failed"],
        )
        store.execute("UPDATE jobs SET state = ?, attempt_count = 1 WHERE id = ?", [state, job_id])


def test_jobs_shows_the_gpu_a_finished_job_ran_on(orch_inproc: OrchRunner, db_path: Path) -> None:
    assert orch_inproc("submit", "--suite", "demo", "--pairs", "1:glue_rte").rc == 0
    _finish(db_path, 1, 3, state="succeeded")
    _finish(db_path, 2, 1, state="queued")  # requeued after an attempt: not on any card now
    listed = {j["id"]: j["gpu"] for j in json.loads(orch_inproc("jobs", "--json").stdout)}
    assert listed == {1: 3, 2: None, 3: None}
    rows = [line.split() for line in orch_inproc("jobs").stdout.splitlines()]
    gpu = rows[0].index("gpu")
    assert [row[gpu] for row in rows[1:]] == ["3", "-", "-"]


def test_memory_is_one_line_per_shape_and_keys_only_when_asked(orch_inproc: OrchRunner, db_path: Path) -> None:
    from orchestrator.store.attempts import write_shape
    from orchestrator.store.learning import label_shape, record_throughput

    key = shape_key("h", "m", "glue_rte")
    with Store(db_path) as store:
        write_shape(store, key, ShapeMemory(10_240, None, 2))
        label_shape(store, key, "E1", "c L0 glue_rte")
        record_throughput(store, "GPU-1", key, 1, 100.0, "E1", steps=30)
        record_throughput(store, "GPU-1", key, 2, 80.0, "E1", steps=30)  # per job: 2 jobs give 1.6x
    plain = orch_inproc("memory").stdout.splitlines()
    assert plain[0].split()[:3] == ["shape", "peak", "OOM"]
    (row,) = [line for line in plain if "E1/c L0 glue_rte" in line]
    assert "10.0 GiB" in row and "measured (2 attempts)" in row and "GPU-1 1:1.0x (±0%), 2:1.6x (±0%)" in row
    assert key not in "\n".join(plain) and not any(line.strip().startswith("key") for line in plain)
    keyed = orch_inproc("memory", "--keys").stdout.splitlines()
    assert keyed[0].split()[-1] == "key"
    assert [line.split()[-1] for line in keyed if "E1/c L0 glue_rte" in line] == [key]
    assert "orch memory --keys" in orch_inproc("memory", "forget", "nope").stderr


def test_metrics_as_reported_are_each_listed_once() -> None:
    reported = {"accuracy": 0.9, "eval_loss": 0.25, "test_f1": 0.8}
    assert job_metrics({"metrics": reported}, None, aliases=False) == reported
    # what results match on: the test split's metrics, each once (eval_loss is val's loss)
    assert job_metrics({"metrics": reported}, None) == {"accuracy": 0.9, "f1": 0.8}


@pytest.fixture
def client(db_path: Path):  # type: ignore[no-untyped-def]
    pytest.importorskip("starlette", reason="needs the web extra")
    from starlette.testclient import TestClient

    from benchmarks.web_load import build_sweep
    from orchestrator.web.app import create_app

    build_sweep(db_path, 12, running=1, queued=2)
    with TestClient(create_app(db_path, "t0ken"), base_url="http://127.0.0.1:8765") as test_client:
        yield test_client


def test_the_job_page_writes_values_as_yaml_and_metrics_once(  # type: ignore[no-untyped-def]
    client, db_path: Path
) -> None:
    from orchestrator.rundir_files import RunDir
    from orchestrator.store.queries import get_attempts

    with Store(db_path) as store:
        with store.write():
            store.execute(
                "UPDATE jobs SET overrides_json = ? WHERE id = 1",
                [json.dumps({"use_dora": True, "note": None})],
            )
            store.execute("UPDATE attempts SET changes_json = ? WHERE job_id = 1",
                          [json.dumps({"gradient_checkpointing": True, "batch_size": 2})])
        run_dir = [
            a
            for a in get_attempts(store, 1)
            if a.outcome is not None and a.outcome.value == "succeeded"
        ][-1].run_dir
    RunDir(Path(run_dir)).result.write_text(json.dumps({"status": "succeeded",
                                                        "metrics": {"test": {"accuracy": 0.81, "eval_loss": 0.25}}}))
    page = client.get("/job/1").text
    assert "<code>use_dora=true</code>" in page and "<code>note=null</code>" in page
    assert "gradient_checkpointing=true" in page and "True" not in page and "None" not in page
    metrics = re.search(r'class="final-metrics">(.*?)</td>', page, re.S)
    assert metrics is not None and re.findall(r"<b>(\w+)</b>", metrics.group(1)) == ["accuracy", "eval_loss"]


def test_the_overview_says_which_config_is_paused_and_why(  # type: ignore[no-untyped-def]
    client, db_path: Path
) -> None:
    from orchestrator.store.endings import pause_config

    with Store(db_path) as store:
        suite, config = store.query("SELECT suite, config_name FROM jobs WHERE id = 1")[0].values()
        assert pause_config(store, suite, config, "3 attempts failed within 30 s each in the last 5 min", "paused")
    page = client.get("/").text
    assert f"config {config} of suite {suite}: 3 attempts failed within 30 s each in the last 5 min" in page
    assert f'action="/api/suites/{suite}/resume"' in page
