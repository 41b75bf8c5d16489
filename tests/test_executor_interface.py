"""The executor seam (executors/base.py): an abstract interface, and one registry of backends."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from orchestrator.executors.backends import (
    CLUSTER_EXECUTOR_NAMES,
    EXECUTOR_NAMES,
    LOCAL_EXECUTOR_NAMES,
)
from orchestrator.executors.base import Executor, LaunchHandle, LaunchSpec, is_cluster_executor
from orchestrator.executors.factory import make_local_executor
from orchestrator.executors.slurm.executor import SlurmExecutor
from orchestrator.store.rows import Attempt, Job


class ForgetsObserveAndStop(Executor):
    name = "forgetful"

    def submit(self, spec: LaunchSpec) -> LaunchHandle:
        return LaunchHandle(executor=self.name, pid=None)


def test_a_backend_that_forgets_observe_or_stop_cannot_be_made() -> None:
    with pytest.raises(TypeError, match="observe"):
        ForgetsObserveAndStop()  # type: ignore[abstract]
    with pytest.raises(TypeError, match="submit"):
        Executor()  # type: ignore[abstract]


def test_a_backend_that_says_each_can_be_made() -> None:
    class Complete(ForgetsObserveAndStop):
        def observe(  # type: ignore[override]
            self, attempts: Sequence[tuple[Attempt, Job]]
        ) -> dict[int, object] | None:
            return None

        def stop(self, attempt: Attempt, job: Job) -> None:
            pass

    assert Complete().observe([]) is None


def test_the_registry_names_every_backend_once(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (*LOCAL_EXECUTOR_NAMES, *sorted(CLUSTER_EXECUTOR_NAMES)) == EXECUTOR_NAMES
    assert SlurmExecutor.name in CLUSTER_EXECUTOR_NAMES and is_cluster_executor("slurm")
    monkeypatch.delenv("ORCH_LAUNCHER", raising=False)
    for name in LOCAL_EXECUTOR_NAMES:
        executor = make_local_executor(name, "orch-test-registry-unused")
        assert executor.name == name and not executor.remote and not is_cluster_executor(name)
        assert executor.observe([]) == {}
