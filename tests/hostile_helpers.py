"""Helpers for tests where workers, neighbours or the disk turn hostile: the hostile worker's
command, a second Unix user (created when the tests run as root), a victim process."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

HOSTILE_WORKER = Path(__file__).resolve().parent / "data" / "hostile_worker.py"


def hostile_command() -> str:
    """The worker template of a suite whose configs say what to corrupt (`corrupt: MODE`)."""
    return f"{sys.executable} {HOSTILE_WORKER} {{config}} {{run_dir}}"


@contextlib.contextmanager
def second_user() -> Iterator[pwd.struct_passwd]:
    """A throwaway Unix user, created here and removed afterwards; skips unless we are root."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root (and useradd) to create a second Unix user")
    name = f"orchx{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                   capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


def as_user(user: pwd.struct_passwd) -> dict[str, object]:
    """Popen/run keyword arguments that run the command as `user`."""

    def drop() -> None:
        os.setgid(user.pw_gid)
        os.setgroups([])
        os.setuid(user.pw_uid)

    return {"preexec_fn": drop}


def start_victim(user: pwd.struct_passwd | None = None) -> psutil.Process:
    """A process orch never started (in its own session), optionally another user's."""
    extra = as_user(user) if user is not None else {}
    proc = subprocess.Popen(
        ["sleep", "600"],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        **extra,
    )  # type: ignore[call-overload]
    return psutil.Process(proc.pid)


def stop_victim(victim: psutil.Process) -> None:
    with contextlib.suppress(psutil.Error):
        victim.kill()
        victim.wait(5)


@contextlib.contextmanager
def small_tmpfs(folder: Path, size_mib: int, before_unmount: Callable[[], object] = lambda: None) -> Iterator[Path]:
    """`folder` made (0700) and a real tmpfs of `size_mib` mounted on it; on leaving,
    `before_unmount` (what still writes there stopped), then unmounted. The test is skipped where
    mounting is not allowed (CI runs as root)."""
    folder.mkdir(mode=0o700)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(folder)],
                             capture_output=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        try:
            before_unmount()
        finally:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)


def fill_filesystem(filler: Path) -> None:
    """Write `filler` until its filesystem is full, for real (no injected fault). Unbuffered, and
    the closing under the suppression too: a buffered file's close flushes what the full disk
    refused, and raised ENOSPC past a suppression entered after the open."""
    with contextlib.suppress(OSError), open(filler, "wb", buffering=0) as handle:
        while True:
            handle.write(b"\0" * (1 << 20))
