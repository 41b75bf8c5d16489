"""`share_base: sequential`: what the thin client of an attempt and the warm process that trains
its job agree on. No torch here: the client starts fast.

A warm process serves one base key (the model folder and its revision, the dtype, the device
and the environment a process reads once at start: CUDA, PyTorch, threads) on one card slot `n`.
Its files live in one folder (orch passes the runs dir's `.warm/` as ORCH_SHARE_DIR):

- `KEY-n.sock`: where it listens; one job at a time.
- `KEY-n.client.lock`: held (flock) by the attempt whose job it trains, for the attempt's life.
  A client takes the first free `n` of its key, so two attempts on one card use two processes;
  a warm process that has been idle for a while exits only if it can take this lock itself, so
  it never leaves a client that just arrived.
- `KEY-n.server.lock`: held by the warm process for its life (never two for one slot).
- `job-DIGEST.lock`: held by a warm process while it trains one job (workers.lora.resume_guard).

Messages are JSON lines. Client to server: `{"job": {"run_dir", "config", "env"}}`, then
`{"stop": SIGNAL}` when orch stops the attempt. Server to client: `{"out": TEXT}` (the job's
output, which the client prints, so stdout.log and the attempt's tmux window have it), then
`{"exit": CODE}`. A client that goes away stops its job.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

SHARE_DIR_VAR = "ORCH_SHARE_DIR"
IDLE_VAR = "ORCH_SHARE_IDLE_S"
DEFAULT_IDLE_S = 20.0  # a warm process with no job for this long exits (a hand-off takes < 1 s)
MAX_FUSED_MEMBERS = 16  # the largest fused group (ORCH_FUSE_MAX, fused_members); orch's own copy too
MAX_SLOTS = 64  # warm processes of one key (one per attempt running at once on its card)
SOCKET_PATH_MAX = 100  # a Unix socket path is at most 107 bytes
MAX_LINE_BYTES = 4 * 1024 * 1024

# Read by a process once, at start (CUDA, PyTorch, BLAS threads, libraries' caches): a warm
# process serves only jobs whose values of these are its own.
KEY_ENV_PREFIXES = (
    "CUDA_",
    "PYTORCH_",
    "TORCH",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "NVIDIA_",
    "NCCL_",
    "TRITON_",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "LD_",
)
KEY_ENV_NAMES = ("PYTHONPATH", "VIRTUAL_ENV", "ORCH_WORKER_DEVICE")
# The attempt's own: never given to a warm process at start (it outlives the attempt, and orch
# finds an attempt's processes by ORCH_ATTEMPT_MARK), set for each job while it runs instead.
ATTEMPT_ENV = (
    "ORCH_ATTEMPT_MARK",
    "ORCH_ATTEMPT_TOKEN",
    "ORCH_CGROUP",
    "ORCH_JOB_ID",
    "ORCH_ATTEMPT",
    "ORCH_RUN_DIR",
    "ORCH_SEED",
    "PYTHONHASHSEED",
    "TMUX",
    "TMUX_PANE",
)


def process_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a warm process starts with: the attempt's, less its own variables."""
    return {name: value for name, value in env.items() if name not in ATTEMPT_ENV}


def base_key(model: str, model_digest: str, prec: str, env: Mapping[str, str]) -> str:
    """A short name for (model, its content, dtype, interpreter, process environment)."""
    process = sorted(
        (name, value)
        for name, value in env.items()
        if name.startswith(KEY_ENV_PREFIXES) or name in KEY_ENV_NAMES
    )
    text = json.dumps([model, model_digest, prec, sys.executable, process])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def unshareable(peft: Mapping[str, Any]) -> str | None:
    """Why a job cannot train in a warm process, or None: a spec that trains base parameters
    (biases, modules_to_save) would hand the next job a changed base."""
    bias = peft.get("bias", "none")
    if bias not in (None, "none"):
        return f"its LoRA spec trains base biases (bias: {bias})"
    if peft.get("modules_to_save"):
        return "its LoRA spec trains base modules (modules_to_save)"
    return None


def digest_of(record: Any) -> str:
    """A key part from a provenance record (data or model); empty when it holds only a note
    (the content could not be read): such a part is never cached."""
    if not isinstance(record, dict) or not record or set(record) == {"note"}:
        return ""
    return json.dumps(record, sort_keys=True, default=str)


def share_dir(env: Mapping[str, str]) -> Path:
    """Where the sockets and locks are: ORCH_SHARE_DIR, or a private folder under the temporary
    directory when that is unset or too long for a socket path."""
    given = env.get(SHARE_DIR_VAR)
    fallback = Path(env.get("TMPDIR") or tempfile.gettempdir()) / f"orch-warm-{os.getuid()}"
    if given:
        folder = Path(given)
        if len(str(folder / f"{'0' * 16}-{MAX_SLOTS}.sock")) <= SOCKET_PATH_MAX:
            return folder
        fallback = fallback / hashlib.sha256(given.encode()).hexdigest()[:10]
    return fallback


def server_command(folder: Path, key: str, slot: int, fused: bool = False,
                   env_file: Path | None = None) -> list[str]:
    """The command line of a slot's warm process (`--env-file`: start again with that
    environment, as a client's tmux window does)."""
    return [
        sys.executable, "-m", "workers.lora.server", "--dir", str(folder), "--key", key, "--slot", str(slot),
        *(["--env-file", str(env_file)] if env_file is not None else []),
        *(["--fused"] if fused else []),
    ]  # fmt: skip


def slot_paths(folder: Path, key: str, slot: int) -> tuple[Path, Path, Path]:
    """(socket, client lock, server lock) of one slot."""
    stem = folder / f"{key}-{slot}"
    return Path(f"{stem}.sock"), Path(f"{stem}.client.lock"), Path(f"{stem}.server.lock")


def try_lock(path: Path) -> int | None:
    """An open descriptor holding an exclusive flock on `path`, or None when another holds it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def messages(sock: socket.socket) -> Iterator[dict[str, Any]]:
    """The JSON objects a peer sends, until it closes; a line that is not one is skipped."""
    buffer = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, OSError):
            return
        if not chunk:
            return
        buffer += chunk
        if len(buffer) > MAX_LINE_BYTES and b"\n" not in buffer:
            return  # not our protocol
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                yield message
