"""The executor backends by name: the one list the CLI's choices, the factory and the question
"does this attempt run on a cluster" are read from. Importing it loads no backend;
executors.factory makes them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    name: str  # what `--executor` takes and an attempt row's `executor` records
    # Its attempts run on another node: orch can neither see nor signal their process groups,
    # only ask the backend.
    cluster: bool


BACKENDS: tuple[Backend, ...] = (
    Backend("tmux", cluster=False),
    Backend("subprocess", cluster=False),
    Backend("slurm", cluster=True),
)
EXECUTOR_NAMES = tuple(backend.name for backend in BACKENDS)
LOCAL_EXECUTOR_NAMES = tuple(backend.name for backend in BACKENDS if not backend.cluster)
CLUSTER_EXECUTOR_NAMES = frozenset(backend.name for backend in BACKENDS if backend.cluster)
