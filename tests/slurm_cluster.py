"""A real single-node Slurm for tests: munged, slurmctld and slurmd on tests/slurm/*.conf.

Fake GPUs `gpu:2,shard:8` sit on existing character devices (/dev/tty0, /dev/tty1), no cgroups.
Everything lives in one private directory; the daemons run as the current user (root in CI).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent / "slurm"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol")


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


_GIVEN_PORTS: set[int] = set()


def _free_port() -> int:
    """A port free now, below the kernel's range for outgoing connections (its start read from
    /proc, 32768 by default): slurmctld binds it a while later, and a port from that range could
    be taken in between by any connection a test beside this one opens."""
    try:
        first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = 32768
    low = max(1024, min(20000, first_ephemeral - 2000))
    for port in random.sample(range(low, first_ephemeral), min(200, first_ephemeral - low)):
        if port in _GIVEN_PORTS:  # slurmctld's and slurmd's are two
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            _GIVEN_PORTS.add(port)
            return port
    raise RuntimeError(f"no free port from {low} to {first_ephemeral}")


@dataclass
class SlurmCluster:
    root: Path
    host: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    procs: dict[str, int] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        for sub in ("state", "spool", "log", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        text = (CONFIG_DIR / "slurm.conf.in").read_text()
        for key, value in {
            "@HOST@": self.host, "@DIR@": str(self.root),
            "@CTLD_PORT@": str(_free_port()), "@SLURMD_PORT@": str(_free_port()),
        }.items():
            text = text.replace(key, value)
        self.conf.write_text(text)
        shutil.copy(CONFIG_DIR / "gres.conf", self.root / "gres.conf")
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def start(self) -> None:
        self.write_config()
        munge = self.root / "munge"
        done = self._run(
            _binary("munged"), "--force", f"--socket={munge / 'munge.socket.2'}", f"--key-file={munge / 'munge.key'}",
            f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'seed'}",
        )
        if done.returncode != 0:
            raise RuntimeError(f"munged did not start: {done.stderr}")
        self.procs["munged"] = int((munge / "munged.pid").read_text())
        self.start_slurmctld()
        self.start_slurmd()
        self.wait_idle()

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            [_binary(name), "-D", "-f", str(self.conf), *args], env={**os.environ, **self.env},
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        self.procs[name] = proc.pid

    def start_slurmctld(self) -> None:
        self._spawn("slurmctld", "-i")

    def start_slurmd(self) -> None:
        self._spawn("slurmd")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        pid = self.procs.pop(name, None)
        if pid is not None:
            try:
                os.kill(pid, sig)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass

    def node_state(self) -> str:
        done = self._run("sinfo", "-h", "-N", "-o", "%T")
        states = set(done.stdout.split())  # one line per partition the node is in
        return states.pop() if len(states) == 1 else " ".join(sorted(states))

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.node_state()
            if state in ("idle", "mixed", "allocated"):
                return
            if state.startswith("down") or state.startswith("drain"):
                self._run("scontrol", "update", f"NodeName={self.host}", "State=RESUME")
            time.sleep(0.5)
        raise RuntimeError(f"slurm node not up after {timeout_s:.0f} s (state {state!r}); see {self.root / 'log'}")

    def shards_in_use(self) -> int:
        """Shards held by running jobs, as Slurm sees them (squeue's TRES per node)."""
        done = self._run("squeue", "-h", "-t", "RUNNING", "-o", "%b")
        total = 0
        for line in done.stdout.split():
            for part in line.split(","):
                bits = part.split(":")
                if "shard" in bits and bits[-1].isdigit():
                    total += int(bits[-1])
        return total

    def stop(self) -> None:
        self._run("scancel", "--full", "-u", os.environ.get("USER", "root"))
        for name in ("slurmd", "slurmctld"):
            self.kill(name, signal.SIGTERM)
        pid = self.procs.pop("munged", None)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
