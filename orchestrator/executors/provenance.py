"""Provenance: what an attempt ran with, recorded where it runs. The standard library only (the
wrapper starts under `python -S`; our LoRA worker imports this too); NVML is asked through
orchestrator.gpu, by the wrapper only, once site-packages are loaded.

The wrapper writes `provenance.json` into the run dir after the worker has started, from a
thread, so the worker's start waits for none of it: the git commit and dirty flag of the
worker's working directory, orch's own version (and commit and dirty flag where it runs from a
git checkout), for our built-in workers a sha256 of the `workers` package they run, the host, the
GPU it was given (model, driver, CUDA; "simulated" on sim GPUs) and, unless the worker reports its
own (ORCH_WORKER_PROVENANCE, set for our LoRA worker), the Python and library versions of the
worker's interpreter, read by running it once with `importlib.metadata` (nothing is imported). Our
LoRA worker puts its own record (versions, CUDA runtime, device, a content hash of its data files,
the model's revision or weights digest) under `provenance` in result.json. orch reads both as
untrusted input (attempts.provenance_reads).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# Set in the environment of our workers, whose versions the wrapper does not read: the value says
# where they are instead (the LoRA worker's result.json) or why there are none (the simulated one).
WORKER_PROVENANCE_VAR = "ORCH_WORKER_PROVENANCE"
WORKER_PROVENANCE_NOTES = {"lora": "recorded by the worker (result.json)",
                           "sim": "none: the simulated worker trains nothing"}
# The libraries a training run's numbers depend on, where installed (distribution names).
LIBRARIES = ("torch", "transformers", "peft", "accelerate", "datasets", "tokenizers", "safetensors", "numpy",
             "trl", "deepspeed", "flash-attn", "bitsandbytes", "flash-linear-attention", "triton")
# orch's own code: the folder holding the `orchestrator` package (a checkout's root, or
# site-packages), and the `workers` package beside it (our built-in workers).
ORCH_ROOT = Path(__file__).resolve().parents[2]
WORKERS_DIR = ORCH_ROOT / "workers"
GIT_TIMEOUT_S = 10.0
INTERPRETER_TIMEOUT_S = 30.0
NOT_A_REPOSITORY = "not a git repository"
_PYTHON = re.compile(r"^python[0-9.]*$")
# Run by the worker's interpreter: its version and the installed versions, as one JSON line.
# `-c` puts the working directory first on sys.path: a json.py there would run, so it goes
# before anything is imported (what `python -P` does, on any Python 3).
_VERSIONS_SNIPPET = (
    "import sys\n"
    "if sys.path and sys.path[0] == '':\n"
    "    del sys.path[0]\n"
    "import json\n"
    "from importlib import metadata\n"
    "found = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        found[name] = metadata.version(name)\n"
    "    except Exception:\n"
    "        pass\n"
    "print(json.dumps({'python': sys.version.split()[0], 'executable': sys.executable, 'libraries': found}))\n"
)


# git reads the repository's own config, which may name commands (an fsmonitor hook, filter
# drivers, hooks): none of them may run when orch looks at a worker's code. System and global
# config are not read, hooks and fsmonitor are off, the index is never written (no lock, no
# post-index-change hook), submodules are not entered and each filter driver is emptied.
_GIT_SAFE_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_ATTR_NOSYSTEM": "1",
                 "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_COUNT": "0"}
_GIT_SAFE_FLAGS = ("-c", "core.fsmonitor=false", "-c", f"core.hooksPath={os.devnull}",
                   "-c", "core.untrackedCache=false", "-c", "core.attributesFile=" + os.devnull,
                   "--no-optional-locks")
_FILTER_KEY = re.compile(r"^filter\.(.+)\.[a-z]+$")


def _filter_overrides(config_names: str) -> list[str]:
    """`-c` options emptying every filter driver the repository's config names (`git config
    --name-only` output): git then reads files as they are, running no clean or process command."""
    drivers = {m.group(1) for line in config_names.splitlines() if (m := _FILTER_KEY.match(line.strip()))}
    flags: list[str] = []
    for driver in sorted(drivers):
        for key, value in (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false")):
            flags += ["-c", f"filter.{driver}.{key}={value}"]
    return flags


def git_state(directory: Path) -> dict[str, Any]:
    """{"commit": sha, "dirty": bool} of the repository holding `directory`, else {"commit": None,
    "note": "not a git repository"} (or why git could not say). Runs nothing the repository's
    config names (_GIT_SAFE_ENV, _GIT_SAFE_FLAGS, _filter_overrides)."""
    git = shutil.which("git")
    if git is None:
        return {"commit": None, "note": "git not found"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_CONFIG")} | _GIT_SAFE_ENV

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([git, "-C", str(directory), *_GIT_SAFE_FLAGS, *args], capture_output=True,
                              text=True, timeout=GIT_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL, env=env)

    try:
        head = run("rev-parse", "--verify", "HEAD")
        if head.returncode != 0:
            inside = run("rev-parse", "--is-inside-work-tree")
            note = "no commit yet" if inside.returncode == 0 else NOT_A_REPOSITORY
            return {"commit": None, "note": note}
        filters = run("config", "--name-only", "--get-regexp", r"^filter\.")
        status = run(*_filter_overrides(filters.stdout), "status", "--porcelain", "--untracked-files=no",
                     "--ignore-submodules=all", "--no-renames")
    except (OSError, subprocess.SubprocessError) as exc:
        return {"commit": None, "note": f"git failed: {type(exc).__name__}"}
    commit = head.stdout.strip()
    if not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit):  # the wrapper's reaper may have taken its status
        return {"commit": None, "note": "git gave no commit"}
    return {"commit": commit, "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


def installed_versions(names: Iterable[str] = LIBRARIES) -> dict[str, str]:
    """Versions of the distributions installed for this interpreter (none imported)."""
    from importlib import metadata

    found: dict[str, str] = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def worker_interpreter(argv: list[str]) -> str | None:
    """The Python interpreter a worker command runs in: `python ...` itself, or the interpreter
    named by the `#!` line of the program it starts (`torchrun`, `accelerate`, a script); None
    when it is not a Python program (a shell script: its libraries are not known)."""
    if not argv:
        return None
    program = shutil.which(argv[0]) or argv[0]
    if _PYTHON.match(os.path.basename(program)):
        return program
    try:
        with open(program, "rb") as handle:
            first = handle.readline(256).decode("utf-8", errors="replace")
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    if words and _PYTHON.match(os.path.basename(words[0])):
        return shutil.which(words[0]) or words[0]
    return None


def interpreter_versions(interpreter: str) -> dict[str, Any]:
    """Python and library versions as the worker's interpreter reports them (one short run)."""
    try:
        done = subprocess.run([interpreter, "-c", _VERSIONS_SNIPPET, *LIBRARIES], capture_output=True, text=True,
                              timeout=INTERPRETER_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
        record = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        record = None
    if not isinstance(record, dict):
        return {"note": f"could not read versions from {interpreter}"}
    return {key: record[key] for key in ("python", "executable", "libraries") if key in record}


def gpu_state(visible: str, probe_gpus: Callable[[], list[tuple[str, str, int]]] | None,
              driver: Callable[[], dict[str, str]] | None) -> dict[str, Any]:
    """The cards the attempt was given (CUDA_VISIBLE_DEVICES: UUIDs or indices), by model, with
    the driver and its CUDA version; {"kind": "simulated"} on sim GPUs."""
    if os.environ.get("ORCH_GPU_BACKEND", "").strip().lower() == "sim":
        state: dict[str, Any] = {"kind": "simulated"}
    else:
        state = {"kind": "nvml"}
        if driver is not None:
            state.update(driver())
    wanted = [part.strip() for part in visible.split(",") if part.strip()]
    if probe_gpus is None or not wanted:
        return state
    try:
        cards = probe_gpus()  # (uuid, name, index) of every card
    except Exception as exc:  # no NVML here: say so, do not fail the attempt
        state["note"] = f"GPUs not readable: {type(exc).__name__}"
        return state
    names = [name for uuid, name, index in cards if uuid in wanted or str(index) in wanted]
    if names:
        state["models"] = names
    return state


def host_state() -> dict[str, Any]:
    return {"name": socket.gethostname(), "platform": platform.platform(terse=True)}


def hash_files(paths: Iterable[Path], base: Path) -> dict[str, Any]:
    """A sha256 over the files' paths (relative to `base`) and contents, in path order, and each
    file's own: the same data in another folder hashes the same."""
    overall = hashlib.sha256()
    files: dict[str, str] = {}
    for path in sorted(paths, key=lambda p: p.relative_to(base).as_posix()):
        name = path.relative_to(base).as_posix()
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        files[name] = digest.hexdigest()
        overall.update(f"{name}\0{files[name]}\n".encode())
    return {"sha256": overall.hexdigest(), "files": files}


def weights_digest(paths: Iterable[Path], edge_bytes: int = 1 << 20) -> str:
    """A cheap fingerprint of weight files too large to hash whole at every start: each file's
    name, size, and sha256 of its first and last `edge_bytes`."""
    overall = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.name):
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(edge_bytes)
            handle.seek(max(0, size - edge_bytes))
            tail = handle.read(edge_bytes)
        overall.update(f"{path.name}\0{size}\0".encode() + hashlib.sha256(head + tail).digest())
    return overall.hexdigest()


def orch_record(root: Path = ORCH_ROOT) -> dict[str, Any]:
    """orch's own version and, where it runs from a git checkout, that checkout's commit and
    dirty flag (read as `git_state` reads a worker's: nothing the repository configures runs)."""
    version = _orch_version()
    if not (root / ".git").exists():
        return {"version": version, "note": "not a git checkout"}
    return {"version": version, **git_state(root)}


def _orch_version() -> str:
    """The installed distribution's version ("unknown" where orch runs without being installed)."""
    from importlib import metadata

    try:
        return metadata.version("orch")
    except metadata.PackageNotFoundError:
        return "unknown"


def builtin_worker_code(name: str, package_dir: Path = WORKERS_DIR) -> dict[str, Any]:
    """The code of one of orch's own workers: a sha256 over the Python files of the `workers`
    package it runs from (its modules and the harness they share), so a worker changed
    mid-sweep (an edit, another checkout, another install) reads as other code."""
    files = [p for p in package_dir.rglob("*.py") if p.is_file() and not p.is_symlink()]
    digest = hash_files(files, package_dir)
    return {"worker": name, "package_dir": str(package_dir), "sha256": digest["sha256"], "files": len(files)}


def builtin_worker(note: str) -> str | None:
    """Which of our workers an attempt runs, from the note the daemon set for it."""
    return next((name for name, text in WORKER_PROVENANCE_NOTES.items() if text == note), None)


def wrapper_record(argv: list[str], cwd: Path, probe_gpus: Callable[[], list[tuple[str, str, int]]] | None,
                   driver: Callable[[], dict[str, str]] | None) -> dict[str, Any]:
    """What the wrapper knows of the attempt it runs."""
    record: dict[str, Any] = {"recorded_by": "wrapper", "cwd": str(cwd), "code": git_state(cwd),
                              "host": host_state(), "orch": orch_record(),
                              "gpu": gpu_state(os.environ.get("CUDA_VISIBLE_DEVICES", ""), probe_gpus, driver)}
    if os.environ.get(WORKER_PROVENANCE_VAR):  # the value says where they are, or why there are none
        record["python"] = {"note": os.environ[WORKER_PROVENANCE_VAR][:200]}
        name = builtin_worker(os.environ[WORKER_PROVENANCE_VAR])
        if name is not None:
            record["worker_code"] = builtin_worker_code(name)
    else:
        interpreter = worker_interpreter(argv)
        record["python"] = interpreter_versions(interpreter) if interpreter else {
            "note": f"{os.path.basename(argv[0]) if argv else 'the worker'} is not a Python program"}
    return record


def own_python() -> dict[str, Any]:
    """This interpreter's version and libraries (for a worker that records its own)."""
    return {"python": sys.version.split()[0], "executable": sys.executable, "libraries": installed_versions()}
