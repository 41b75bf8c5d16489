"""An attempt's run dir: the name of every file in it, and the one atomic writer.

The daemon, the wrapper, the executors and our workers all read and write these files, so the
names live here once. The standard library only: `python -m orchestrator.executors.wrapper.run` and
the workers (`workers/`) import this module, and both must start fast and stay free of orch's
dependencies.

Every write is atomic: the bytes go to a temp file created exclusively in the same directory,
are synced, and the temp file is renamed over the name (or, for an exclusive create, linked to
it, which fails when the name exists). A reader never sees half a file, and a symlink planted
under the name is replaced, never written through.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

# The attempt's own random token, in its wrapper's and worker's environment: the wrapper writes
# it into exit.json, our workers into result.json, and the daemon ignores a record without it
# (written into this run dir by some other attempt's worker).
TOKEN_VAR = "ORCH_ATTEMPT_TOKEN"
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class RunDir:
    """The files of one attempt's run dir: the names as class constants, the paths as properties.

    Names (the worker protocol, docs/worker-protocol.md):
    - written by orch before launch: CONFIG (the merged YAML), ENV;
    - written by the wrapper: PID (before the worker starts, exclusively), EXIT (after it ends),
      LOG (the worker's stdout+stderr), GPU_PEAK (its process tree's GPU memory), PROVENANCE
      (code, host, GPU and interpreter it ran with);
    - written by the worker: PROGRESS (heartbeats, one JSON line each), RESULT (once, at the end),
      SHARE (the LoRA worker's client, once a warm process took its job: `share_base`);
    - written by the daemon: LOST_MARKER (before it declares an attempt without PID lost),
      SBATCH_SCRIPT (the Slurm executor's batch script), and Slurm writes SLURM_OUTPUT.
    Everything but CONFIG, ENV and SBATCH_SCRIPT can be written by user code: untrusted input.
    """

    CONFIG = "config.yaml"
    ENV = "env.json"
    PID = "pid.json"
    EXIT = "exit.json"
    LOG = "stdout.log"
    GPU_PEAK = "gpu_peak.json"
    PROVENANCE = "provenance.json"
    PROGRESS = "progress.jsonl"
    RESULT = "result.json"
    SHARE = "share.json"
    LOST_MARKER = "lost"
    SBATCH_SCRIPT = "sbatch.sh"
    SLURM_OUTPUT = "slurm-%j.out"  # Slurm's own output file; it fills in %j, the job id

    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunDir) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    @property
    def config(self) -> Path:
        return self.path / self.CONFIG

    @property
    def env(self) -> Path:
        return self.path / self.ENV

    @property
    def pid(self) -> Path:
        return self.path / self.PID

    @property
    def exit(self) -> Path:
        return self.path / self.EXIT

    @property
    def log(self) -> Path:
        return self.path / self.LOG

    @property
    def gpu_peak(self) -> Path:
        return self.path / self.GPU_PEAK

    @property
    def progress(self) -> Path:
        return self.path / self.PROGRESS

    @property
    def result(self) -> Path:
        return self.path / self.RESULT

    @property
    def lost_marker(self) -> Path:
        return self.path / self.LOST_MARKER

    @property
    def sbatch_script(self) -> Path:
        return self.path / self.SBATCH_SCRIPT


def write_in_dir(
    dir_fd: int, name: str, data: bytes, *, mode: int = 0o600, exclusive: bool = False
) -> bool:
    """Write `data` as `name` in the directory `dir_fd`, atomically (see the module's doc).

    With `exclusive`, the file is created only if `name` does not exist yet (a symlink counts)
    and False is returned when it does; otherwise an existing file is replaced. True: written."""
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(tmp, _TMP_FLAGS, mode, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)  # the open's mode is masked by the umask
            os.fsync(fd)
        finally:
            os.close(fd)
        if not exclusive:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return True
        try:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)


def write_atomic(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    mode: int = 0o600,
    exclusive: bool = False,
    parents: bool = False,
) -> bool:
    """Write `data` to `path` atomically; `parents` creates missing directories first.
    Returns False only for an `exclusive` write that found the name taken."""
    path = Path(path)
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    dir_fd = os.open(path.parent, _DIR_FLAGS)
    try:
        return write_in_dir(dir_fd, path.name, data, mode=mode, exclusive=exclusive)
    finally:
        os.close(dir_fd)


def json_bytes(payload: Any) -> bytes:
    """The encoding every JSON record in a run dir uses (a value JSON cannot hold becomes str)."""
    return json.dumps(payload, indent=2, sort_keys=True, default=str).encode("utf-8")


def write_json(
    path: str | os.PathLike[str],
    payload: Any,
    *,
    mode: int = 0o600,
    exclusive: bool = False,
    parents: bool = False,
) -> bool:
    """`payload` as JSON at `path`, atomically (see write_atomic)."""
    return write_atomic(path, json_bytes(payload), mode=mode, exclusive=exclusive, parents=parents)


def write_text(path: str | os.PathLike[str], text: str, *, mode: int = 0o600, parents: bool = False) -> None:
    """`text` (UTF-8) at `path`, atomically (see write_atomic)."""
    write_atomic(path, text.encode("utf-8"), mode=mode, parents=parents)
