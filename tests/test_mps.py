"""CUDA MPS without a GPU: the fence, a client's variables, who may share, reading a broken
server in a worker's log, the daemon's events when a server fails, and `--mps` where the
binary is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.attempts.classify import classify_log_tail
from orchestrator.daemon.mps_watch import MpsWatch
from orchestrator.gpu.mps import (
    REASON_MPS,
    MpsControl,
    MpsDirs,
    MpsState,
    client_env,
    failed_cards,
    fence_mib,
    is_mps_failure,
    may_share,
    mps_dirs,
)
from orchestrator.lifecycle import AttemptOutcome, JobState
from orchestrator.plans import expand_jobs, load_suite, parse_pairs
from orchestrator.store import Store
from orchestrator.store.attempts import AttemptEnd, AttemptPlan, finish_attempt, start_attempt
from orchestrator.store.daemon_row import daemon_row_fields, register_daemon
from orchestrator.store.jobs import submit_jobs
from orchestrator.store.peak_source import PredictionSource, SourceKind
from tests.store_reads import events, job_ids

PLANS = Path(__file__).resolve().parents[1] / "plans"
REPO_ROOT = Path(__file__).resolve().parents[1]
MEASURED = {"measured": True}
DIRS = MpsDirs(Path("/state.db.mps/pipe"), Path("/state.db.mps/log"))


def test_a_measured_shape_is_fenced_at_its_peak_plus_a_margin() -> None:
    assert fence_mib(0, measured=True) is None  # nothing predicted: no fence
    assert fence_mib(1024, measured=True) == 1024 + 512  # at least 512 MiB over
    assert fence_mib(20_000, measured=True) == 22_000  # else 10 %


def test_an_unmeasured_shape_is_not_fenced() -> None:
    # The scarce TRL sweep: declared 3 GiB, true 15.7 GiB. Fenced at 3.9 GiB it went two ladder
    # levels down on a card with room; a figure nothing has measured never fences a job.
    assert fence_mib(3072, measured=False) is None
    assert fence_mib(20_000, measured=False) is None


def test_a_client_gets_the_pipe_the_log_and_its_fence() -> None:
    env = client_env(DIRS, 4000, measured=True)
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": "/state.db.mps/pipe", "CUDA_MPS_LOG_DIRECTORY": "/state.db.mps/log",
                   "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4512M"}  # fmt: skip
    declared = client_env(DIRS, 4000, measured=False)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in declared
    assert declared["CUDA_MPS_PIPE_DIRECTORY"] == "/state.db.mps/pipe"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in client_env(DIRS, 0, measured=True)


def test_gangs_and_run_alone_attempts_do_not_share() -> None:
    state = MpsState(MpsControl(DIRS, ("GPU-a",), binary="unused"), {"GPU-a", "GPU-b"})
    assert may_share(1, False) and not may_share(2, False) and not may_share(1, True)
    shared = state.env_for("GPU-a", 1, False, 1000, **MEASURED)
    assert shared["CUDA_MPS_PIPE_DIRECTORY"] == "/state.db.mps/pipe"
    assert state.env_for("GPU-a", 2, False, 1000, **MEASURED) == {}  # a gang
    assert state.env_for("GPU-a", 1, True, 1000, **MEASURED) == {}  # run_alone
    assert state.turn_off("GPU-b") and not state.turn_off("GPU-b")
    assert state.env_for("GPU-b", 1, False, 1000, **MEASURED) == {}  # MPS turned off for that card


def test_pipe_folder_falls_back_where_the_state_path_is_too_long(tmp_path: Path) -> None:
    short = mps_dirs(Path("/srv/state.db"))
    assert short.pipe == Path("/srv/state.db.mps/pipe")
    deep = mps_dirs(tmp_path / ("x" * 120) / "state.db")
    assert len(str(deep.pipe)) < 90 and f"orch-mps-{os.getuid()}-" in str(deep.pipe)
    assert deep == mps_dirs(tmp_path / ("x" * 120) / "state.db")  # the same database, the same folder


@pytest.mark.parametrize("line", [
    "RuntimeError: CUDA error: cudaErrorMpsServerNotReady",
    "torch.AcceleratorError: CUDA error: MPS client failed to connect to the MPS control daemon or the MPS server",
    "RuntimeError: CUDA driver error: CUDA_ERROR_MPS_SERVER_NOT_READY",
])  # fmt: skip
def test_a_broken_server_in_the_log_is_said_as_such(line: str) -> None:
    assert is_mps_failure(line)
    found = classify_log_tail(f"Traceback (most recent call last):\n  File 'x.py'\n{line}\n")
    assert found is not None and found.outcome is AttemptOutcome.FAILED and found.reason == REASON_MPS


def test_an_oom_under_the_fence_stays_an_oom() -> None:
    found = classify_log_tail("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    assert found is not None and found.outcome is AttemptOutcome.OOM
    assert not is_mps_failure("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")


def test_a_fault_that_took_its_neighbours_down_turns_mps_off_for_that_card() -> None:
    illegal = "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
    cublas = "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx(...)`"
    assert failed_cards([("GPU-0", 100.0, illegal), ("GPU-0", 100.4, cublas), ("GPU-1", 100.2, illegal)]) == {
        "GPU-0": "a device fault ended 2 workers sharing its MPS server"}
    # one job's own fault, or two far apart, or a plain error: MPS stays on
    assert failed_cards([("GPU-0", 100.0, illegal), ("GPU-0", 500.0, illegal)]) == {}
    assert failed_cards([("GPU-0", 100.0, "ValueError: bad"), ("GPU-0", 100.1, "KeyError: x")]) == {}
    assert failed_cards([("GPU-2", 1.0, REASON_MPS)]) == {"GPU-2": "the MPS server failed a worker"}


def _attempt_failed_by_mps(store: Store, db_path: Path, uuid: str) -> None:
    suite = load_suite("demo", PLANS)
    submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:glue_rte"), {}, None, 0),
                allowed_gpus=None, priority=0, force=False, dry_run=False)  # fmt: skip
    plan = AttemptPlan(job_ids(store)[0], 0, uuid, 0, "base", {}, {}, False, 1024,
                       PredictionSource(SourceKind.DECLARED), 1024)  # fmt: skip
    attempt = start_attempt(store, plan, lambda n: db_path.parent / f"run-{n}")
    finish_attempt(store, attempt, AttemptEnd("failed", REASON_MPS, 1, None, 0, JobState.QUEUED, {}, "failed"))


def test_a_card_whose_server_failed_a_worker_leaves_mps(db_path: Path) -> None:
    with Store(db_path) as store:
        own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            state = MpsState(MpsControl(DIRS, (), binary="unused", pid=own.pid), {"GPU-0", "GPU-1"})
            watch = MpsWatch(store, state, since_s=0.0)
            register_daemon(store, os.getpid(), 0.0, 0.0, lambda pid, created: None, modes=("overlap", "mps"))
            _attempt_failed_by_mps(store, db_path, "GPU-1")
            watch.check(1e12, {"GPU-0": 0, "GPU-1": 1})
            assert state.cards == {"GPU-0"}
            assert modes(store) == ["overlap", "mps"]  # still on for GPU 0
            said = [e.message for e in events(store, "daemon")]
            assert any(
                "the MPS server failed a worker on GPU 1 (jobs 1): MPS off for that card" in m
                for m in said
            ), said
            watch.check(1e12, {"GPU-0": 0, "GPU-1": 1})  # read once: no second event
            assert (
                len(
                    [
                        m
                        for m in (e.message for e in events(store, "daemon"))
                        if "on GPU 1 (jobs 1): MPS off" in m
                    ]
                )
                == 1
            )
        finally:
            own.kill()
            own.wait(10)
        watch.check(1e12, {"GPU-0": 0, "GPU-1": 1})  # the control daemon is gone: off everywhere
        assert state.cards == set()
        assert any("MPS control daemon is gone: MPS off for GPU 0" in e.message for e in events(store, "daemon"))
        assert modes(store) == ["overlap"]  # `orch status` no longer says --mps


def test_mps_off_for_its_last_card_leaves_the_daemons_modes(db_path: Path) -> None:
    with Store(db_path) as store:
        own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            state = MpsState(MpsControl(DIRS, (), binary="unused", pid=own.pid), {"GPU-1"})
            register_daemon(store, os.getpid(), 0.0, 0.0, lambda pid, created: None, modes=("mps",))
            _attempt_failed_by_mps(store, db_path, "GPU-1")
            MpsWatch(store, state, since_s=0.0).check(1e12, {"GPU-1": 1})
            assert state.cards == set() and modes(store) == []
        finally:
            own.kill()
            own.wait(10)


def modes(store: Store) -> list[str]:
    fields = daemon_row_fields(store)
    assert fields is not None
    return list(fields["modes"])


def test_mps_without_the_binary_is_one_clear_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(PATH=str(tmp_path), PYTHONPATH=str(REPO_ROOT), ORCH_DB=str(tmp_path / "state.db"))
    done = subprocess.run([sys.executable, "-m", "orchestrator", "daemon", "start", "--mps"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "orch: error: --mps: nvidia-cuda-mps-control is not on PATH (it comes with NVIDIA's driver); run without --mps"
    ]
    assert not (tmp_path / "state.db").exists()  # nothing written


def test_only_a_peak_of_the_shape_itself_tightens_the_fence() -> None:
    from orchestrator.scheduling.launching import MEASURED_SHAPE

    assert {SourceKind.MEASURED, SourceKind.RUNNING} == MEASURED_SHAPE
    for borrowed in (SourceKind.LEVEL, SourceKind.TASK, SourceKind.FAMILY, SourceKind.ESTIMATE,
                     SourceKind.DECLARED, SourceKind.OOM_FLOOR):  # fmt: skip
        assert borrowed not in MEASURED_SHAPE


@pytest.mark.parametrize("share_base", ["off", "sequential", "fused"])
def test_a_warm_processs_opener_is_not_fenced_a_job_of_its_own_is(tmp_path: Path, share_base: str) -> None:
    """A warm LoRA worker process outlives the attempt that starts it and trains other jobs: a
    fence of its opener's would bound them all (and split the warm processes by fence)."""
    import yaml

    from orchestrator.gpu.snapshot import GpuSnapshot
    from orchestrator.plans import GpuPlan
    from orchestrator.prediction.job_facts import JobShapeCache, job_levels, job_shape_key
    from orchestrator.scheduling.dispatch import DispatchContext, schedule
    from orchestrator.scheduling.packing.types import PackingPolicy
    from orchestrator.scheduling.state import SchedulerState
    from orchestrator.store.attempts import write_shape
    from orchestrator.store.jobs import set_gpu_plan
    from orchestrator.store.rows import ShapeMemory
    from tests.store_reads import read_jobs
    from tests.test_scale import _Recorder

    plans = tmp_path / "plans"
    (plans / "configs" / "wb").mkdir(parents=True)
    (plans / "suites").mkdir(parents=True)
    (plans / "configs" / "wb" / "c1.yaml").write_text(yaml.safe_dump({"model": "tiny-llama", "batch_size": 2}))
    (plans / "suites" / "wb.yaml").write_text(yaml.safe_dump(
        {"worker": "lora", "mem_gib": 2, "configs": ["c1"], "share_base": share_base}))
    suite = load_suite("wb", plans)
    store = Store(tmp_path / "state.db")
    set_gpu_plan(store, GpuPlan(slots_by_gpu={}, default_slots=2))
    submit_jobs(store, suite, expand_jobs(suite, parse_pairs("1:toy"), {}, None, 0), allowed_gpus=None,
                priority=0, force=False, dry_run=False)
    job = read_jobs(store)[0]
    write_shape(store, job_shape_key(job, job_levels(job, JobShapeCache())[0]), ShapeMemory(3000, None, 1))
    control = MpsControl(mps_dirs(tmp_path / "state.db"), ("GPU-0",), binary="/bin/false")
    ctx = DispatchContext(tmp_path / "runs", PackingPolicy(), {}, mps=MpsState(control, {"GPU-0"}))
    card = (GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=24_000, used_mib=0, free_mib=24_000,
                        processes=()),)  # fmt: skip
    recorder = _Recorder()
    schedule(store, card, recorder, ctx, SchedulerState(), draining=False)
    env = recorder.specs[0].env
    assert "CUDA_MPS_PIPE_DIRECTORY" in env  # under MPS either way
    fence = env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
    assert fence == (f"0={fence_mib(3150, measured=True)}M" if share_base == "off" else None)
    store.close()
