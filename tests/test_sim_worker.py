"""The sim worker as a real process on simulated GPUs, read back through the sim probe."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import yaml
from e2e_helpers import wait_until

from orchestrator.attempts.classify import classify_attempt
from orchestrator.gpu import make_probe
from orchestrator.gpu.sim import hold_foreign
from orchestrator.gpu.sim_files import sim_uuid
from orchestrator.lifecycle import AttemptOutcome
from orchestrator.plans.ladder_spec import load_ladder
from orchestrator.prediction.ladder import expand_levels, retry_decision
from workers import harness
from workers.sim import HOST_BYTES_PER_WORKER, check_sim_fail, host_oom_error, predicted_peak_mib

REPO = Path(__file__).resolve().parents[1]
FAST = {"sim_seconds": 1, "sim_ramp_s": 0.3, "batch_size": 8, "seed": 87}


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    state_dir = tmp_path / "sim"
    monkeypatch.setenv("ORCH_SIM_GPUS", "10GiB,10GiB")
    monkeypatch.setenv("ORCH_SIM_DIR", str(state_dir))
    monkeypatch.delenv("ORCH_SIM_FOREIGN", raising=False)
    return state_dir


def start_worker(
    tmp_path: Path, name: str, config: dict[str, object], gpu: str
) -> subprocess.Popen[str]:
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**FAST, **config}))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workers.sim",
            "--config",
            str(run_dir / "config.yaml"),
            "--run-dir",
            str(run_dir),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result(tmp_path: Path, name: str) -> dict[str, object]:
    return json.loads((tmp_path / name / "result.json").read_text())


def test_two_workers_overfill_a_card_one_ooms_with_torch_message(sim: Path, tmp_path: Path) -> None:
    probe = make_probe("sim")
    workers = {
        name: start_worker(tmp_path, name, {"sim_mem_gib": 6}, sim_uuid(0)) for name in ("a", "b")
    }
    outputs = {name: proc.communicate(timeout=30) for name, proc in workers.items()}
    codes = sorted(proc.returncode for proc in workers.values())
    assert codes == [0, harness.EXIT_OOM]

    oomed = next(name for name, proc in workers.items() if proc.returncode == harness.EXIT_OOM)
    ok = next(name for name in workers if name != oomed)
    stderr = outputs[oomed][1]
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB." in stderr
    assert "GPU 0 has a total capacity of 10.00 GiB of which" in stderr
    assert "expandable_segments:True" in stderr
    assert result(tmp_path, oomed)["status"] == "oom"

    done = result(tmp_path, ok)
    assert done["status"] == "succeeded"
    assert done["peak_mem_mib"] == 6144
    assert 0.7 <= done["metrics"]["test"]["accuracy"] <= 0.9  # type: ignore[index]
    progress = [
        json.loads(line) for line in (tmp_path / ok / "progress.jsonl").read_text().splitlines()
    ]
    assert len(progress) >= 3 and progress[-1]["step"] == progress[-1]["total"]
    assert progress[-1]["loss"] < progress[0]["loss"]
    assert max(b["t"] - a["t"] for a, b in itertools.pairwise(progress)) < 0.5

    assert [s.used_mib for s in probe.snapshot()] == [0, 0]  # freed on exit


def test_memory_is_visible_while_running_and_foreign_memory_counts(
    sim: Path, tmp_path: Path
) -> None:
    probe = make_probe("sim")
    hold_foreign(sim, 1, 6 * 1024)
    running = start_worker(tmp_path, "run", {"sim_mem_gib": 3, "sim_seconds": 2}, "0")
    blocked = start_worker(tmp_path, "blocked", {"sim_mem_gib": 6}, sim_uuid(1))

    wait_until(lambda: probe.snapshot()[0].used_mib == 3072)
    gpu0 = probe.snapshot()[0]
    assert [(p.pid, p.used_mib) for p in gpu0.processes] == [(running.pid, 3072)]

    _, stderr = blocked.communicate(timeout=30)
    assert blocked.returncode == harness.EXIT_OOM
    assert "CUDA out of memory" in stderr
    snap1 = probe.snapshot()[1]
    assert snap1.used_mib == 6144 and [p.pid for p in snap1.processes] == [0]

    running.communicate(timeout=30)
    assert running.returncode == 0
    assert probe.snapshot()[0].used_mib == 0


def test_a_start_up_holds_the_base_alone_before_the_first_step(sim: Path, tmp_path: Path) -> None:
    probe = make_probe("sim")
    config = {"sim_mem_gib": 4, "sim_base_gib": 0.5, "sim_startup_s": 4, "sim_exit_s": 2}
    worker = start_worker(tmp_path, "starting", config, "0")
    run_dir = tmp_path / "starting"
    samples = []  # (MiB held, steps reported, result written), read as the worker runs
    while worker.poll() is None:
        progress = run_dir / "progress.jsonl"
        steps = len(progress.read_text().splitlines()) if progress.exists() else 0
        samples.append((probe.snapshot()[0].used_mib, steps, (run_dir / "result.json").exists()))
        time.sleep(0.05)  # sampling the worker's memory as it runs
    assert worker.returncode == 0 and result(tmp_path, "starting")["status"] == "succeeded"
    assert (512, 0, False) in samples  # the base alone, before any step
    # the peak from the first step on, until its result is written (it frees its memory after)
    assert all(held == 4096 for held, steps, written in samples if steps and not written)
    assert (4096, 4, False) in samples  # after its last step it holds the peak while it "saves"
    assert probe.snapshot()[0].used_mib == 0


def test_sigterm_frees_memory_and_hang_stops_heartbeats(sim: Path, tmp_path: Path) -> None:
    probe = make_probe("sim")
    proc = start_worker(
        tmp_path, "hang", {"sim_mem_gib": 2, "sim_fail": "hang", "sim_seconds": 1}, "0"
    )
    progress = tmp_path / "hang" / "progress.jsonl"

    def last_step() -> int:
        record = harness.read_last_progress(tmp_path / "hang")
        return int(record["step"]) if record else 0

    wait_until(lambda: last_step() == 2)  # it hangs after half of its 4 steps
    lines = progress.read_text().count("\n")
    time.sleep(0.6)  # the property under test is that nothing happens for a while
    assert progress.read_text().count("\n") == lines
    assert proc.poll() is None and probe.snapshot()[0].used_mib == 2048

    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=10)
    assert probe.snapshot()[0].used_mib == 0
    assert not list((sim / "gpu0").glob("*.json"))


def test_sim_fail_error_is_a_python_traceback(sim: Path, tmp_path: Path) -> None:
    proc = start_worker(tmp_path, "err", {"sim_mem_gib": 1, "sim_fail": "error"}, "0")
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == harness.EXIT_FAILED
    assert "Traceback (most recent call last)" in stderr and "out of memory" not in stderr
    assert result(tmp_path, "err")["status"] == "failed"


def test_config_error_exit_code(sim: Path, tmp_path: Path) -> None:
    proc = start_worker(tmp_path, "bad", {"sim_mem_gib": 1}, "GPU-not-a-sim-gpu")
    proc.communicate(timeout=30)
    assert proc.returncode == harness.EXIT_CONFIG_ERROR
    assert result(tmp_path, "bad")["status"] == "config_error"


def test_memory_model_responds_to_the_degradation_knobs() -> None:
    base = {"sim_mem_gib": 10, "batch_size": 8}
    full = predicted_peak_mib(base)
    assert full == 10240
    checkpointed = predicted_peak_mib({**base, "gradient_checkpointing": True})
    one_logit = predicted_peak_mib({**base, "logits_to_keep": 1})
    halved = predicted_peak_mib({**base, "batch_size": 4, "gradient_accumulation_steps": 2})
    assert checkpointed < full and one_logit < full and halved < full
    assert halved == ((4 + 3) * 1024)  # base 4 GiB + half of 6 GiB activations
    assert predicted_peak_mib({**base, "batch_size": 4, "sim_reference_batch": 8}) == halved
    assert predicted_peak_mib({**base, "num_data_workers": 0}) == full


HOST_OOM = {"sim_mem_gib": 1, "sim_fail": "host_oom", "num_data_workers": 2}


def test_host_oom_only_while_data_workers_exceed_the_threshold() -> None:
    error = host_oom_error(HOST_OOM, loader_pid=4242)
    assert error is not None
    assert "DefaultCPUAllocator: can't allocate memory: you tried to allocate " in str(error)
    assert f"allocate {2 * HOST_BYTES_PER_WORKER} bytes" in str(error)
    assert host_oom_error({**HOST_OOM, "num_data_workers": 0}, 4242) is None
    assert host_oom_error({k: v for k, v in HOST_OOM.items() if k != "num_data_workers"}, 1) is None
    assert host_oom_error({**HOST_OOM, "sim_host_max_workers": 2}, 4242) is None
    assert host_oom_error({**HOST_OOM, "sim_host_max_workers": 1}, 4242) is not None
    assert host_oom_error({**HOST_OOM, "sim_fail": "error", "num_data_workers": 8}, 4242) is None

    loader = host_oom_error({**HOST_OOM, "sim_host_oom_kind": "dataloader"}, loader_pid=4242)
    assert loader is not None
    assert str(loader) == "DataLoader worker (pid(s) 4242) exited unexpectedly"
    assert "DataLoader worker (pid 4242) is killed by signal: Killed." in str(loader.__cause__)


def test_the_ladders_host_oom_level_clears_the_sim_host_oom() -> None:
    config = {**HOST_OOM, "batch_size": 4, "gradient_accumulation_steps": 1}
    levels = expand_levels(load_ladder(None), config, one_token_task=False)
    decision = retry_decision(AttemptOutcome.HOST_OOM, "host OOM", 1, levels, 0)
    assert decision.action == "requeue" and decision.level is not None
    overrides = {**decision.level.overrides, **decision.host.overrides}
    assert host_oom_error({**config, **overrides}, 4242) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sim_host_oom_kind": "swap"}, "sim_host_oom_kind must be one of allocator, dataloader"),
        ({"sim_host_max_workers": -1}, "sim_host_max_workers must be an integer >= 0"),
        ({"num_data_workers": "two"}, "num_data_workers must be an integer >= 0"),
    ],
)
def test_invalid_host_oom_settings_are_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_sim_fail({**HOST_OOM, **change})
    check_sim_fail({**HOST_OOM, **change, "sim_fail": "error"})  # only host_oom reads them


@pytest.mark.parametrize("kind", ["allocator", "dataloader"])
def test_sim_fail_host_oom_fails_like_torch_and_frees_the_gpu(
    sim: Path, tmp_path: Path, kind: str
) -> None:
    probe = make_probe("sim")
    proc = start_worker(tmp_path, kind, {**HOST_OOM, "sim_host_oom_kind": kind}, "0")
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == harness.EXIT_FAILED
    assert "Traceback (most recent call last)" in stderr
    outcome = result(tmp_path, kind)
    assert outcome["status"] == "failed"
    assert str(outcome["error"]).startswith("RuntimeError: ")
    from_log = classify_attempt(
        exit_code=proc.returncode, signal=None, result=None, log_tail=stderr
    )
    assert from_log.outcome is AttemptOutcome.HOST_OOM, from_log
    assert probe.snapshot()[0].used_mib == 0
    if kind == "allocator":
        verdict = classify_attempt(
            exit_code=proc.returncode, signal=None, result=outcome, log_tail=stderr
        )
        assert verdict.outcome is AttemptOutcome.HOST_OOM, verdict


def test_sim_fail_host_oom_passes_at_the_threshold(sim: Path, tmp_path: Path) -> None:
    proc = start_worker(tmp_path, "ok", {**HOST_OOM, "sim_host_max_workers": 2}, "0")
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert result(tmp_path, "ok")["status"] == "succeeded"


def test_dataloader_host_oom_reported_in_result_json_is_host_oom() -> None:
    # result.json names only the last exception; the host-RAM cause is chained above it in the log
    error = host_oom_error({**HOST_OOM, "sim_host_oom_kind": "dataloader"}, loader_pid=4242)
    assert error is not None
    log_tail = "".join(traceback.format_exception(error))
    written = {"status": "failed", "error": f"{type(error).__name__}: {error}"}  # as workers.sim
    verdict = classify_attempt(exit_code=1, signal=None, result=written, log_tail=log_tail)
    assert verdict.outcome is AttemptOutcome.HOST_OOM, verdict
