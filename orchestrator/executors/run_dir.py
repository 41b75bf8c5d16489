"""An attempt's run dir, environment and command line, prepared before anything is launched.

Nothing here goes through a shell: the config is dumped YAML, the env is a validated dict, and
a command template is split into argv once and filled in token by token.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import UsageError
from orchestrator.plans.template import NAMES, OUR_WORKERS, parse_template
from orchestrator.rundir_files import RunDir, write_in_dir

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PLACEHOLDERS = NAMES

# Injected into every attempt (DESIGN.md, worker protocol). The suite env comes after and wins.
BASE_ENV = {
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",  # so stdout.log and the tmux pane show progress as it happens
}


def validate_env(env: Mapping[str, str]) -> dict[str, str]:
    """The env as a plain dict; a bad name or a value with NUL is a UsageError."""
    checked: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            raise UsageError(
                f"invalid environment variable name {name!r}: use letters, digits and _"
            )
        if not isinstance(value, str):
            raise UsageError(f"environment variable {name} must be a string, got {value!r}")
        if "\0" in value:
            raise UsageError(f"environment variable {name} contains a NUL byte")
        checked[name] = value
    return checked


def make_private_dirs(path: Path) -> None:
    """Create `path` and its missing parents, each 0700 (`mkdir(parents=True)` would give the
    parents the umask's default, 0755 for most users). Existing dirs are left as they are."""
    missing: list[Path] = []
    current = Path(path)
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            directory.mkdir(mode=0o700)
            os.chmod(directory, 0o700)  # mkdir's mode is masked by the umask


def prepare_run_dir(run_dir: Path, config: dict[str, Any], env: dict[str, str]) -> Path | None:
    """Create `run_dir` and its missing parents (0700) with config.yaml (dumped YAML) and
    env.json (0600). Every level is reached without following a symlink and must be ours
    (runtree); a symlink named config.yaml is replaced, never written through. A run dir that
    already holds files is not this attempt's (runtree.set_aside_stale): it is moved aside
    first, and its new path returned."""
    from orchestrator.executors.runs_tree import open_run_dir, set_aside_stale

    config_text = yaml.safe_dump(config, sort_keys=False)
    env_text = json.dumps(validate_env(env), indent=2, sort_keys=True)
    moved_to = set_aside_stale(Path(run_dir))
    with open_run_dir(Path(run_dir), create=True) as dir_fd:
        write_in_dir(dir_fd, RunDir.CONFIG, config_text.encode("utf-8"))
        write_in_dir(dir_fd, RunDir.ENV, env_text.encode("utf-8"))
    return moved_to


def build_worker_env(
    *,
    gpu_uuid: str,
    gpu_index: int,
    seed: int | None,
    suite_env: dict[str, str],
    extra: dict[str, str],
) -> dict[str, str]:
    """The variables injected into one attempt (on top of the inherited environment).

    The GPU is named by uuid, so a reordered bus cannot put the job on another card;
    ORCH_GPU_INDEX keeps the index for display. Later sources win: base, suite env, extra.
    """
    env = dict(BASE_ENV)
    env["CUDA_VISIBLE_DEVICES"] = gpu_uuid
    env["ORCH_GPU_UUID"] = gpu_uuid
    env["ORCH_GPU_INDEX"] = str(gpu_index)
    if seed is not None:
        env["ORCH_SEED"] = str(seed)
        env["PYTHONHASHSEED"] = str(seed)
    env.update(validate_env(suite_env))
    env.update(validate_env(extra))
    return env


def build_argv(
    worker: str,
    *,
    config_path: Path,
    run_dir: Path,
    values: dict[str, str],
    config: Mapping[str, Any] | None = None,
) -> list[str]:
    """The worker's argv: one of ours ("lora", "sim") or a command template.

    A template such as "python train.py --cfg {config} --batch-size {cfg.batch_size}" is split
    with shlex first and its placeholders (orchestrator.plans.template) are filled inside each
    token, `{cfg.KEY}` from `config` (the attempt's, after --set and the ladder), so a value can
    never become a second argument or reach a shell.
    """
    if worker in OUR_WORKERS:
        return [
            sys.executable,
            "-m",
            OUR_WORKERS[worker],
            "--config",
            str(config_path),
            "--run-dir",
            str(run_dir),
        ]
    template = parse_template(worker)
    names = {name: str(value) for name, value in values.items() if name in PLACEHOLDERS}
    names.update(config=str(config_path), run_dir=str(run_dir))
    return template.fill(names, config or {})
