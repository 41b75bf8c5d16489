"""Suites whose worker is a script of the test's own (not orch's sim or LoRA worker): the
script's configs and the suite that runs it, written into an isolated orch's plans folder."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Protocol

import yaml

PY = shlex.quote(sys.executable)  # the interpreter the tests run under, as a worker command's first word


class HasPlans(Protocol):
    plans: Path


def write_script_suite(
    orch: HasPlans, name: str, worker: str, configs: dict[str, dict[str, Any]], **suite: Any
) -> None:
    """Suite NAME running `worker` over CONFIGS (each written as the script receives it), 1 GiB
    a job unless `mem_gib=` says otherwise."""
    config_dir = orch.plans / "configs" / name
    config_dir.mkdir(parents=True, exist_ok=True)
    for config_name, config in configs.items():
        (config_dir / f"{config_name}.yaml").write_text(yaml.safe_dump(config))
    body = {"worker": worker, "mem_gib": 1, **suite, "configs": list(configs)}
    (orch.plans / "suites" / f"{name}.yaml").write_text(yaml.safe_dump(body))
