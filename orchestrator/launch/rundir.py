"""An attempt's run dir, environment and command line, prepared before anything is launched.

Nothing here goes through a shell: the config is dumped YAML, the env is a validated dict, and
a command template is split into argv once and filled in token by token.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import UsageError
from orchestrator.plans.template import NAMES, parse_template

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
OUR_WORKERS = {"lora": "workers.lora", "sim": "workers.sim"}
PLACEHOLDERS = NAMES
CONFIG_FILE = "config.yaml"
ENV_FILE = "env.json"

# Injected into every attempt (DESIGN.md, worker protocol). The suite env comes after and wins.
BASE_ENV = {
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",  # so stdout.log and the tmux pane show progress as it happens
}


def atomic_write_text(path: Path, text: str, mode: int = 0o600) -> None:
    """Write `text` to `path` through a temp file in the same dir and a rename."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


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


def prepare_run_dir(run_dir: Path, config: dict[str, Any], env: dict[str, str]) -> None:
    """Create `run_dir` and its missing parents (0700) with config.yaml (dumped YAML) and
    env.json (0600). Every level is reached without following a symlink and must be ours
    (runtree); a symlink named config.yaml is replaced, never written through."""
    from orchestrator.launch.runtree import open_run_dir, write_file

    config_text = yaml.safe_dump(config, sort_keys=False)
    env_text = json.dumps(validate_env(env), indent=2, sort_keys=True)
    with open_run_dir(Path(run_dir), create=True) as dir_fd:
        write_file(dir_fd, CONFIG_FILE, config_text.encode("utf-8"))
        write_file(dir_fd, ENV_FILE, env_text.encode("utf-8"))


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


# ---------------------------------------------------------------- reading what a worker printed

OUTPUT_FILE = "stdout.log"  # written by the wrapper (launch/wrapper.py LOG_FILE)


@dataclass(frozen=True)
class OutputStat:
    size_bytes: int
    mtime_s: float


def _open_regular(path: Path) -> int | None:
    """A read-only fd of `path` when it is a regular file reached without following a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def stat_output(run_dir: Path) -> OutputStat | None:
    """Size and modification time of the attempt's stdout.log; None when there is none (or it is
    not a regular file). Its growth is the worker's sign of life."""
    try:
        info = os.lstat(Path(run_dir) / OUTPUT_FILE)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return OutputStat(info.st_size, info.st_mtime)


def read_output(run_dir: Path, start: int, max_bytes: int) -> bytes:
    """At most `max_bytes` of stdout.log from byte `start`: never the whole of a log that may
    be gigabytes."""
    fd = _open_regular(Path(run_dir) / OUTPUT_FILE)
    if fd is None:
        return b""
    try:
        return os.pread(fd, max(0, max_bytes), max(0, start))
    except OSError:
        return b""
    finally:
        os.close(fd)


def read_output_tail(run_dir: Path, max_bytes: int) -> str:
    """The last `max_bytes` of stdout.log, decoded leniently."""
    found = stat_output(run_dir)
    if found is None:
        return ""
    start = max(0, found.size_bytes - max_bytes)
    return read_output(run_dir, start, max_bytes).decode("utf-8", errors="replace")
