"""orch short of descriptors while it launches a batch: the launcher cannot even be run, no
worker of the batch started, and every attempt of it ends at once, uncounted, its job queued
again (they used to wait out the launch grace, a minute, as launches never completed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator.errors import OrchShortOf
from orchestrator.executors.base import LaunchHandle, LaunchSpec, LocalExecutor
from orchestrator.gpu.snapshot import GpuSnapshot
from orchestrator.lifecycle import JobState
from orchestrator.plans import GpuPlan, expand_jobs, load_suite, parse_pairs
from orchestrator.scheduling.dispatch import DispatchContext, schedule
from orchestrator.scheduling.packing.types import PackingPolicy
from orchestrator.scheduling.state import SchedulerState
from orchestrator.store import Store
from orchestrator.store.jobs import set_gpu_plan, submit_jobs
from orchestrator.store.sweep_attempts import all_attempts
from tests.conftest import REPO_ROOT
from tests.store_reads import read_jobs


class _OutOfDescriptors(LocalExecutor):
    name = "fake"

    def submit(self, spec: LaunchSpec) -> LaunchHandle:
        raise AssertionError("a batch is launched with submit_many")

    def submit_many(self, specs: Sequence[LaunchSpec]) -> list[LaunchHandle | Exception]:
        raise OrchShortOf("cannot run tmux: [Errno 24] Too many open files")


def test_a_batch_orch_cannot_launch_ends_uncounted_at_once(tmp_path: Path) -> None:
    suite = load_suite("demo", REPO_ROOT / "plans")
    store = Store(tmp_path / "state.db")
    specs = expand_jobs(suite, parse_pairs("1:glue_rte"), {}, None, 0)
    submit_jobs(store, suite, specs, allowed_gpus=None, priority=0, force=False, dry_run=False)
    set_gpu_plan(store, GpuPlan(slots_by_gpu={}, default_slots=3))
    gpu = (GpuSnapshot(index=0, uuid="GPU-0", name="sim", total_mib=80_000, used_mib=0, free_mib=80_000, processes=()),)
    schedule(store, gpu, _OutOfDescriptors(), DispatchContext(tmp_path / "runs", PackingPolicy(), {}),
             SchedulerState(), draining=False)
    attempts = all_attempts(store)
    assert len(attempts) == 3  # the batch was claimed
    assert all(a.outcome == "lost" and a.ended_at is not None for a in attempts), [
        (a.outcome, a.reason) for a in attempts
    ]
    assert all("Too many open files" in (a.reason or "") for a in attempts)
    jobs = read_jobs(store)
    assert all(job.state is JobState.QUEUED for job in jobs)  # to be started again
    assert all(job.max_attempts == suite.max_attempts + 1 for job in jobs)  # not counted
