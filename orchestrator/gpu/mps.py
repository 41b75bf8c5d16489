"""CUDA MPS for orch's own GPUs: the one module that runs NVIDIA's `nvidia-cuda-mps-control`.

Under an MPS control daemon the kernels of several processes on one card run at the same time
instead of taking turns, which is where co-located jobs gain throughput. orch runs its own
control daemon, in its own pipe and log folders (next to the state database), for the cards it
manages (named by UUID: indices would be remapped by CUDA_VISIBLE_DEVICES), and points each
worker that may share a card at it through `CUDA_MPS_PIPE_DIRECTORY`. A client with no control
daemon reachable there runs without MPS, so a worker left out (a gang, a `run_alone` attempt,
a card where MPS was turned off) simply gets no such variables.

Each client also gets `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`: a job over its budget gets an
out-of-memory error of its own, which the ladder reads as any OOM, instead of taking the memory
its neighbours were promised. Only a measured peak of the job's own shape sets a fence (that peak
plus a margin); a shape never run is not fenced, so a declared or estimated figure that is too
low never forces a ladder step of orch's own.

Pure parts (the fence, a client's environment, reading a worker's error as an MPS failure) take
values and return values; `MpsControl` is the thin shell around the binary.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from orchestrator.errors import MpsError, UsageError

log = logging.getLogger(__name__)

CONTROL_BINARY = "nvidia-cuda-mps-control"
SERVER_PROCESS = "nvidia-cuda-mps-server"
CONTROL_TIMEOUT_S = 10.0  # one control command (get_server_list, quit)
START_TIMEOUT_S = 10.0  # the control daemon's socket appears in its pipe folder
# The fence over the prediction: a job measured to the MiB still varies a little between runs
# (allocator rounding, cuBLAS workspaces); 10 % and at least 512 MiB kept every measured job of
# the GPU benchmarks under it.
FENCE_MARGIN_FRACTION = 0.10
FENCE_MIN_MARGIN_MIB = 512
SOCKET_PATH_MAX = 100  # a Unix socket path is at most 107 bytes; the daemon adds its own names

# What a client prints when the MPS server it was using is gone or broken: not the job's fault.
REASON_MPS = "the MPS server failed the worker (not an error of the job's own)"
MPS_FAILURES = re.compile(
    r"(?i:cudaErrorMpsConnectionFailed|cudaErrorMpsServerNotReady|cudaErrorMpsRpcFailure|"
    r"cudaErrorMpsClientTerminated|CUDA_ERROR_MPS_\w+|MPS client failed to connect to the MPS control daemon|"
    r"the MPS server (?:has )?(?:terminated|died|is not ready)|MPS client terminated)"
)


@dataclass(frozen=True)
class MpsDirs:
    pipe: Path  # the control daemon's sockets: a client finds it through CUDA_MPS_PIPE_DIRECTORY
    log: Path  # control.log and server.log


def control_binary() -> str | None:
    """The MPS control binary on PATH, or None on a machine without it."""
    return shutil.which(CONTROL_BINARY)


def require_binary() -> str:
    found = control_binary()
    if found is None:
        raise UsageError(f"--mps: {CONTROL_BINARY} is not on PATH (it comes with NVIDIA's driver); "
                         "run without --mps")
    return found


def mps_dirs(db_path: Path) -> MpsDirs:
    """Next to the state database (`STATE.db.mps/`), unless that path is too long for a Unix
    socket: then a private folder under the temporary directory named for the database."""
    base = Path(str(Path(db_path).resolve()) + ".mps")
    if len(str(base / "pipe" / "control_privileged")) > SOCKET_PATH_MAX:
        digest = hashlib.sha256(str(Path(db_path).resolve()).encode()).hexdigest()[:10]
        base = Path(os.environ.get("TMPDIR", "/tmp")) / f"orch-mps-{os.getuid()}-{digest}"
    return MpsDirs(base / "pipe", base / "log")


def fence_mib(predicted_peak_mib: int, *, measured: bool) -> int | None:
    """The device memory a client may pin; None (no fence) where nothing is predicted.

    `measured`: the prediction is a peak measured on this very shape (a finished or running
    attempt of it); the fence is then that peak plus the margin. Any other prediction (declared,
    estimated, borrowed from another level, task or batch size) may be far below the truth: a
    declared 3 GiB for a true 15.7 GiB, fenced at 3.9 GiB, forced two halvings on a card with
    room to spare. Such a client is not fenced: it may use what it was placed into, including
    memory that a running attempt frees while it starts (`--overlap`), which a figure taken at
    its launch would not hold; a physical OOM is the ladder's, as without MPS."""
    if predicted_peak_mib <= 0 or not measured:
        return None
    return predicted_peak_mib + max(FENCE_MIN_MARGIN_MIB, int(predicted_peak_mib * FENCE_MARGIN_FRACTION))


def client_env(dirs: MpsDirs, predicted_peak_mib: int, *, measured: bool,
               trial_fence_mib: int | None = None) -> dict[str, str]:
    """What a worker needs to run as a client of orch's control daemon. The fence names device 0:
    the worker sees only its card (CUDA_VISIBLE_DEVICES). A start on trial is fenced at the room it
    was started into (`trial_fence_mib`: less than its prediction asked), whatever its prediction."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe), "CUDA_MPS_LOG_DIRECTORY": str(dirs.log)}
    limit = trial_fence_mib if trial_fence_mib else fence_mib(predicted_peak_mib, measured=measured)
    if limit is not None:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={limit}M"
    return env


def may_share(gpus: int, run_alone: bool) -> bool:
    """Gangs (NCCL across cards) and `run_alone` attempts stay out of MPS: a gang's ranks would
    share one server's fate, and an attempt alone on its card gains nothing from it."""
    return gpus == 1 and not run_alone


# A device fault (illegal address, a failed launch) in one MPS client ends every client of that
# card's server: measured on an H200, two neighbours of a client that wrote through a bad pointer
# died with `an illegal memory access` and `CUBLAS_STATUS_EXECUTION_FAILED`. Without MPS they
# finished. Two such failures on one card this close together are the server's, not two jobs'.
DEVICE_FAULT = re.compile(
    r"(?i:illegal memory access|illegal address|CUBLAS_STATUS_EXECUTION_FAILED|unspecified launch failure|"
    r"cudaErrorLaunchFailure|CUDA_ERROR_LAUNCH_FAILED|misaligned address)"
)
SPREAD_WINDOW_S = 10.0


def is_mps_failure(text: str) -> bool:
    """Whether a worker's error text says the MPS server failed it (not its own code or memory)."""
    return bool(MPS_FAILURES.search(text))


def failed_cards(failures: Iterable[tuple[str, float, str]], window_s: float = SPREAD_WINDOW_S) -> dict[str, str]:
    """GPU UUID -> why MPS should go off there, from (card, ended at, reason) of failed attempts:
    a worker failed by the server itself, or device faults in two workers of one card within
    `window_s` of each other (one client's fault took its neighbours down)."""
    off: dict[str, str] = {}
    faults: dict[str, list[float]] = {}
    for uuid, ended_at, reason in failures:
        if reason == REASON_MPS or is_mps_failure(reason):
            off.setdefault(uuid, "the MPS server failed a worker")
        elif DEVICE_FAULT.search(reason):
            faults.setdefault(uuid, []).append(ended_at)
    for uuid, times in faults.items():
        times.sort()
        if any(b - a <= window_s for a, b in itertools.pairwise(times)):
            off.setdefault(uuid, f"a device fault ended {len(times)} workers sharing its MPS server")
    return off


@dataclass(frozen=True)
class ForeignServer:
    pid: int
    name: str
    user: str


def foreign_servers(own_pids: Iterable[int] = ()) -> list[ForeignServer]:
    """MPS control daemons or servers running that are not orch's own (another user's, or one
    started by hand): orch leaves them alone and says so."""
    own = set(own_pids)
    found = []
    for proc in psutil.process_iter(["pid", "name", "username", "ppid"]):
        info = proc.info
        if info["name"] not in (CONTROL_BINARY, SERVER_PROCESS) or info["pid"] in own or info["ppid"] in own:
            continue
        found.append(ForeignServer(int(info["pid"]), str(info["name"]), str(info["username"] or "?")))
    return found


@dataclass
class MpsControl:
    """orch's control daemon for the cards named by `gpu_uuids`."""

    dirs: MpsDirs
    gpu_uuids: tuple[str, ...]
    binary: str = field(default_factory=require_binary)
    pid: int | None = None

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(self.dirs.pipe),
               "CUDA_MPS_LOG_DIRECTORY": str(self.dirs.log)}
        if self.gpu_uuids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpu_uuids)
        return env

    def start(self) -> None:
        """Start the control daemon (it forks into the background) and wait for its socket."""
        for folder in (self.dirs.pipe, self.dirs.log):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.answers():
            raise MpsError(f"an MPS control daemon already answers in {self.dirs.pipe}: another orch daemon "
                           "of this state database, or one left behind; stop it with "
                           f"`echo quit | CUDA_MPS_PIPE_DIRECTORY={self.dirs.pipe} {CONTROL_BINARY}`")
        try:
            done = subprocess.run([self.binary, "-d"], env=self._env(), capture_output=True, text=True,
                                  timeout=CONTROL_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"cannot start {CONTROL_BINARY}: {exc}") from exc
        if done.returncode != 0:
            raise MpsError(
                f"{CONTROL_BINARY} -d exited {done.returncode}: {(done.stderr or done.stdout).strip()[:300]}"
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if (self.dirs.pipe / "control").exists():
                self.pid = self._find_pid()
                return
            time.sleep(0.05)
        raise MpsError(f"{CONTROL_BINARY} started but made no socket in {self.dirs.pipe} within "
                       f"{START_TIMEOUT_S:.0f} s; see {self.dirs.log / 'control.log'}")

    def _find_pid(self) -> int | None:
        """The control daemon whose pipe folder is ours (read from its environment)."""
        for proc in psutil.process_iter(["pid", "name"]):
            if proc.info["name"] != CONTROL_BINARY:
                continue
            try:
                if proc.environ().get("CUDA_MPS_PIPE_DIRECTORY") == str(self.dirs.pipe):
                    return int(proc.info["pid"])
            except psutil.Error:
                continue
        return None

    def ask(self, command: str) -> str:
        """One control command (`get_server_list`, `quit`, ...); its answer."""
        try:
            done = subprocess.run([self.binary], input=command + "\n", env=self._env(), capture_output=True,
                                  text=True, timeout=CONTROL_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"{CONTROL_BINARY} did not answer {command!r}: {exc}") from exc
        if done.returncode != 0:
            raise MpsError(f"{CONTROL_BINARY} {command!r} exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[:300]}")
        return done.stdout

    def answers(self) -> bool:
        """Whether a control daemon listens in our pipe folder."""
        if not (self.dirs.pipe / "control").exists():
            return False
        try:
            self.ask("get_server_list")
        except MpsError:
            return False
        return True

    def alive(self) -> bool:
        """Whether our control daemon still runs (cheap: no command sent where its pid is known)."""
        if self.pid is not None:
            return psutil.pid_exists(self.pid)
        return self.answers()

    def own_pids(self) -> set[int]:
        return {self.pid} if self.pid is not None else set()

    def stop(self) -> None:
        """Ask the control daemon to quit (it ends its servers once their clients are gone)."""
        if not (self.dirs.pipe / "control").exists():
            return
        try:
            self.ask("quit")
        except MpsError as exc:
            log.warning("MPS control daemon did not take `quit`: %s", exc)
            return
        deadline = time.monotonic() + CONTROL_TIMEOUT_S
        while self.pid is not None and psutil.pid_exists(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)


@dataclass
class SimulatedControl(MpsControl):
    """MPS on simulated cards (`--backend sim`): no control daemon or server runs, each worker
    gets the variables a client of one would, and the sim worker (workers/sim.py) holds itself to
    its fence as a fenced client is held: a sweep's fences and starts on trial can be rehearsed."""

    binary: str = ""

    def start(self) -> None:
        for folder in (self.dirs.pipe, self.dirs.log):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)

    def ask(self, command: str) -> str:
        return ""

    def answers(self) -> bool:
        return True

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        return None


@dataclass
class MpsState:
    """What the daemon knows of MPS while it runs: the control daemon and the cards still under
    it. A card leaves (for the rest of this daemon's life) when its server failed a worker."""

    control: MpsControl
    cards: set[str]  # GPU UUIDs whose workers are pointed at the control daemon

    def env_for(self, gpu_uuid: str, gpus: int, run_alone: bool, predicted_peak_mib: int, *,
                measured: bool, trial_fence_mib: int | None = None) -> dict[str, str]:  # fmt: skip
        if gpu_uuid not in self.cards or not may_share(gpus, run_alone):
            return {}
        return client_env(self.control.dirs, predicted_peak_mib, measured=measured, trial_fence_mib=trial_fence_mib)

    def turn_off(self, gpu_uuid: str) -> bool:
        """MPS off for one card; True when it was on."""
        if gpu_uuid in self.cards:
            self.cards.discard(gpu_uuid)
            return True
        return False


def start_mps(db_path: Path, gpu_uuids: Iterable[str],
              simulated: bool = False) -> tuple[MpsState, list[ForeignServer]]:
    """Start orch's control daemon for these cards (`simulated`: simulated cards, where none
    runs: SimulatedControl); also the MPS daemons others run (left alone: their clients keep
    theirs, ours connect only to ours)."""
    uuids = tuple(gpu_uuids)
    control = SimulatedControl(mps_dirs(db_path), uuids) if simulated else MpsControl(mps_dirs(db_path), uuids)
    others = [] if simulated else foreign_servers()
    control.start()
    return MpsState(control, set(uuids)), [s for s in others if s.pid not in control.own_pids()]


def describe(servers: list[ForeignServer]) -> str:
    return ", ".join(f"{s.name} pid {s.pid} ({s.user})" for s in servers)
