"""`share_base: sequential`: a warm LoRA worker process trains several jobs one after another,
and each job's numbers are bit-identical to the same job in a fresh process.

Real processes on CPU: each fresh job is `python -m workers.lora` (PYTHONHASHSEED = its seed, as
orch sets it); the warm jobs are clients of one warm process started once, handed the jobs one
after another. The tiny Llama in bf16 with LoRA dropout 0.1, jobs of two configs and three seeds,
one with gradient checkpointing, interleaved so that every job follows a job of another config.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks.noisy_rte import flip_every_fourth_label, numerics_config
from tests.lora_runs import wait_listening
from workers.lora.share import base_key, server_command, share_dir, slot_paths, unshareable

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

pytestmark = [pytest.mark.train, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
SAMPLE_GLUE = ("rte", 60, 40)
STEPS = 12


def job_config(
    data_dir: Path, seed: int, wide: bool, checkpointing: bool = False
) -> dict[str, Any]:
    config = numerics_config(
        data_dir, steps=STEPS, eval_every_steps=4, prec="bf16", seed=seed, dropout=0.1
    )
    if wide:  # another rank, other targets, another rate: an adapter left behind would show
        config["peft"] = {
            "r": 4,
            "alpha": 4,
            "dropout": 0.1,
            "targets": ["q_proj", "k_proj", "o_proj"],
        }
        config["learning_rate"] = 5e-3
    config["gradient_checkpointing"] = checkpointing
    return config


def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "TMUX"))}
    env |= {
        "PYTHONPATH": str(REPO),
        "ORCH_WORKER_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "ORCH_SHARE_DIR": str(tmp_path / "warm"),
        # never idle out mid-test: a fresh run between two warm jobs took over 60 s on a loaded
        # 2-core machine, and the next warm job then found no process (the fixture kills it)
        "ORCH_SHARE_IDLE_S": "900",
    }
    return env


def run_job(run_dir: Path, config: dict[str, Any], env: dict[str, str]) -> subprocess.Popen[bytes]:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    log = (run_dir / "stdout.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "workers.lora", "--run-dir", str(run_dir)],
        env={**env, "PYTHONHASHSEED": str(config["seed"])},
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def numbers(run_dir: Path) -> dict[str, Any]:
    """Every figure a job reports: per-step losses, gradient norms and validations, the
    metrics and the best step."""
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "succeeded", (run_dir / "stdout.log").read_text()[-2000:]
    lines = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    steps = [
        (p["step"], p.get("loss"), p.get("grad_norm"), p.get("lr"), p.get("val")) for p in lines
    ]
    return {
        "steps": steps,
        "metrics": result["metrics"],
        "best_step": result["best_step"],
        "final_loss": result["final_loss"],
        "loss_summary": result["loss_summary"],
    }


WarmServer = tuple[subprocess.Popen[bytes], dict[str, str], Path]  # the process, its env, its log


@contextlib.contextmanager
def started_warm_server(folder: Path) -> Iterator[WarmServer]:
    """A warm process for the tiny Llama in bf16 on CPU, slot 0, started as a client's tmux
    window would start it (the attempt's environment less its own variables)."""
    env = base_env(folder)
    key = base_key("tiny-llama", json.dumps({"builtin": "tiny-llama"}, sort_keys=True), "bf16", env)
    log = folder / "server.log"
    server = subprocess.Popen(
        server_command(share_dir(env), key, 0),
        env={**env, "PYTHONHASHSEED": "12345"},
        cwd=REPO,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_listening(server, share_dir(env), key, log, 60)
        yield server, env, log
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()


@pytest.fixture(scope="module")
def shared_warm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmServer]:
    """One warm process for the tests that leave it usable: the bit-for-bit test trains its jobs
    in it first, on a process that has trained nothing, then the cancel test (a process that has
    trained jobs before is what a sweep's next job finds)."""
    with started_warm_server(tmp_path_factory.mktemp("warm")) as started:
        yield started


@pytest.fixture
def warm_server(tmp_path: Path) -> Iterator[WarmServer]:
    """A warm process of the test's own (the test kills it)."""
    with started_warm_server(tmp_path) as started:
        yield started


def test_jobs_in_one_warm_process_match_fresh_processes_bit_for_bit(
    tmp_path: Path, data_dir: Path, shared_warm_server: WarmServer
) -> None:
    server, env, _log = shared_warm_server
    flip_every_fourth_label(data_dir)
    jobs = [
        (1, False, False),
        (1, True, False),
        (2, False, True),
        (3, True, False),
    ]
    warm_numbers, fresh_numbers = [], []
    fresh_env = {k: v for k, v in env.items() if k != "ORCH_SHARE_DIR"}
    for n, (seed, wide, checkpointing) in enumerate(jobs):
        config = job_config(data_dir, seed, wide, checkpointing)
        warm = run_job(tmp_path / f"warm-{n}", config, {**env, "ORCH_SHARE_BASE": "sequential"})
        assert warm.wait(300) == 0, (tmp_path / f"warm-{n}" / "stdout.log").read_text()[-3000:]
        log = (tmp_path / f"warm-{n}" / "stdout.log").read_text()
        assert "training in warm LoRA worker process" in log and "done: test" in log  # relayed
        result = json.loads((tmp_path / f"warm-{n}" / "result.json").read_text())
        assert result["share_base"] == "sequential" and result["dropout_masks"]
        warm_numbers.append(numbers(tmp_path / f"warm-{n}"))
        fresh = run_job(tmp_path / f"fresh-{n}", config, fresh_env)
        assert fresh.wait(300) == 0, (tmp_path / f"fresh-{n}" / "stdout.log").read_text()[-3000:]
        assert "share_base" not in json.loads((tmp_path / f"fresh-{n}" / "result.json").read_text())
        fresh_numbers.append(numbers(tmp_path / f"fresh-{n}"))
    assert server.poll() is None  # one process trained them all
    for n, (warm, fresh) in enumerate(zip(warm_numbers, fresh_numbers, strict=True)):
        assert warm == fresh, f"job {n} {jobs[n]}"
    assert warm_numbers[0] != warm_numbers[2]  # the seeds' numbers differ: the test can fail
    assert len(warm_numbers[0]["steps"]) >= STEPS


def test_a_cancelled_client_stops_its_job_and_the_warm_process_trains_the_next(
    tmp_path: Path, data_dir: Path, shared_warm_server: WarmServer
) -> None:
    server, env, log = shared_warm_server
    env = {**env, "ORCH_SHARE_BASE": "sequential"}
    long_job = job_config(data_dir, 1, False) | {"max_steps": 100000}
    del long_job["eval_every_steps"]
    client = run_job(tmp_path / "cancelled", long_job, env)
    progress = tmp_path / "cancelled" / "progress.jsonl"
    deadline = time.monotonic() + 120
    while not (progress.exists() and progress.read_text().count("\n") >= 3):
        assert client.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    client.send_signal(signal.SIGTERM)  # what `orch cancel` sends
    assert client.wait(60) == -signal.SIGTERM  # it ends as a worker ended by SIGTERM does
    assert not (tmp_path / "cancelled" / "result.json").exists()
    after = run_job(tmp_path / "after", job_config(data_dir, 2, False), env)
    assert after.wait(300) == 0, (tmp_path / "after" / "stdout.log").read_text()[-3000:]
    assert server.poll() is None
    server_log = log.read_text()
    assert "stopped: orch stopped the attempt" in server_log
    # one job at a time: the next job ran only after the cancelled one had stopped
    assert server_log.index("stopped: orch stopped the attempt") < server_log.index(
        str(tmp_path / "after")
    )


def test_a_job_that_trains_base_parameters_runs_in_its_own_process() -> None:
    assert unshareable({"r": 8, "bias": "lora_only"}) is not None
    assert unshareable({"r": 8, "modules_to_save": ["lm_head"]}) is not None
    assert unshareable({"r": 8, "bias": "none"}) is None


def test_the_base_key_follows_model_dtype_and_process_environment() -> None:
    env = {
        "CUDA_VISIBLE_DEVICES": "GPU-a",
        "OMP_NUM_THREADS": "1",
        "ORCH_SEED": "1",
        "PYTHONHASHSEED": "1",
    }
    key = base_key("/m", "d", "bf16", env)
    assert key == base_key("/m", "d", "bf16", env | {"ORCH_SEED": "2", "PYTHONHASHSEED": "2"})
    assert key != base_key("/m", "d", "fp32", env)
    assert key != base_key("/m", "other weights", "bf16", env)
    assert key != base_key("/m", "d", "bf16", env | {"CUDA_VISIBLE_DEVICES": "GPU-b"})
    assert key != base_key("/m", "d", "bf16", env | {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4000M"})


def serve_in_thread(folder: Path, idle_s: float) -> tuple[Any, list[int]]:
    import threading

    from workers.lora import server

    ended: list[int] = []
    thread = threading.Thread(
        target=lambda: ended.append(server.serve(folder, "k", 0, idle_s)), daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not slot_paths(folder, "k", 0)[0].exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return thread, ended


def hand_over(folder: Path) -> list[dict[str, Any]]:
    """What a client hears back for one job."""
    import socket

    from workers.lora.share import messages, send

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + 30
    while True:  # the socket appears once it listens; a refused connect is retried all the same
        try:
            conn.connect(str(slot_paths(folder, "k", 0)[0]))
            break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "the warm process never listened"
            time.sleep(0.01)
    send(
        conn, {"job": {"run_dir": str(folder / "run"), "config": str(folder / "c.yaml"), "env": {}}}
    )
    heard = []
    for message in messages(conn):
        heard.append(message)
        if "exit" in message:
            break
    conn.close()
    return heard


@pytest.mark.parametrize(("usable", "serves_on"), [(True, True), (False, False)])
def test_a_job_that_leaves_the_process_unusable_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, usable: bool, serves_on: bool
) -> None:
    """An error not the job's own (a CUDA error, say) may have broken the process: it answers
    the job's exit code, removes its socket and exits, so the next client starts a new one."""
    import workers.lora.__main__ as worker

    def job(run_dir: Path, config: Path, cache: Any, heartbeat: Any) -> Any:
        print("training")
        return worker.AttemptEnd(worker.EXIT_FAILED, usable)

    monkeypatch.setattr(worker, "run_attempt", job)
    thread, ended = serve_in_thread(tmp_path, idle_s=5)
    assert hand_over(tmp_path) == [{"out": "training"}, {"out": "\n"}, {"exit": worker.EXIT_FAILED}]
    thread.join(2)
    assert thread.is_alive() is serves_on
    assert slot_paths(tmp_path, "k", 0)[0].exists() is serves_on
    thread.join(30)  # a usable one leaves once idle
    assert ended == [0 if serves_on else 1]


def test_an_idle_warm_process_exits_unless_a_client_holds_its_slot(tmp_path: Path) -> None:
    from workers.lora.share import try_lock

    held = try_lock(slot_paths(tmp_path, "k", 0)[1])  # a client on its way to this slot
    assert held is not None
    thread, ended = serve_in_thread(tmp_path, idle_s=0.2)
    thread.join(1.0)
    assert thread.is_alive()  # idle, but a client holds the slot: it stays
    os.close(held)
    thread.join(10)
    assert not thread.is_alive() and ended == [0]
    assert not slot_paths(tmp_path, "k", 0)[0].exists()


def test_a_warm_process_that_dies_mid_job_fails_that_attempt_with_a_line_saying_so(
    tmp_path: Path, data_dir: Path, warm_server: WarmServer
) -> None:
    server, env, _log = warm_server
    long_job = job_config(data_dir, 1, False) | {"max_steps": 100000}
    del long_job["eval_every_steps"]
    client = run_job(tmp_path / "orphaned", long_job, {**env, "ORCH_SHARE_BASE": "sequential"})
    progress = tmp_path / "orphaned" / "progress.jsonl"
    deadline = time.monotonic() + 120
    while not (progress.exists() and progress.read_text().count("\n") >= 2):
        assert client.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    server.send_signal(signal.SIGKILL)  # the host's OOM killer, say
    assert client.wait(60) == 1
    log = (tmp_path / "orphaned" / "stdout.log").read_text()
    assert "the warm LoRA worker process ended while it trained this job" in log
