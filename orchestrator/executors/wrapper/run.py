"""The launch wrapper: `python -S .../orchestrator/executors/wrapper/run.py --run-dir DIR -- ARGV...`
(or `python -m orchestrator.executors.wrapper.run ...` on another node; see wrapper_argv).

Every attempt runs under this. It leads its own process group (so the whole tree can be killed
at once), records `pid.json` (created exclusively, see claim_run_dir) before the worker starts
and `exit.json` after it ends, both atomically, appends the worker's stdout+stderr to `stdout.log`
while echoing it (so a tmux pane shows it), and forwards SIGTERM/SIGINT/SIGHUP/SIGUSR2 to the worker
(SIGHUP as SIGTERM), naming the signals it received and forwarded in exit.json. Its only word to the
daemon is a poke after exit.json (orchestrator.executors.wake), which may go unheard: a daemon that
was down learns what happened from these files.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO, Any

if __name__ == "__main__" and not __package__:
    # Run by its path under `python -S` (wrapper_argv): the package's root, not this file's
    # directory, goes first on the path (site-packages are added once the worker runs).
    sys.path[0] = str(Path(__file__).resolve().parents[3])

from orchestrator.executors.wake import poke
from orchestrator.executors.wrapper.gpu_peak import GpuPeakSampler
from orchestrator.executors.wrapper.held_dir import HeldRunDir, RunDirMoved, write_quietly
from orchestrator.executors.wrapper.oom_events import oom_kills_since, read_oom_kill_count
from orchestrator.executors.wrapper.strays import (
    CGROUP_VAR,
    OrphanReaper,
    become_subreaper,
    descendants,
    end_leftovers,
    join_cgroup,
)
from orchestrator.gpu.sim_footprint import SimFootprint
from orchestrator.procstat import create_time_s, read_stat
from orchestrator.rundir_files import TOKEN_VAR, RunDir

EXIT_NOT_STARTED = 127  # the shell's "command not found"
EXIT_REFUSED = 75  # EX_TEMPFAIL: the attempt was declared lost (or has a wrapper already)
DISK_RETRY_S = 1.0  # how often a record refused for a full disk is written again
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
DRAIN_S = 2.0  # how long to wait for output of orphaned grandchildren after the worker exits
PROVENANCE_WAIT_S = 20.0  # at most this long for provenance.json after a worker that ended at once
# SIGUSR2: Slurm's warning before a time limit (--signal=B:USR2@N), for a worker that checkpoints
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)


WRAPPER_FILE = Path(__file__).resolve()
# How the wrapper appears on a command line before `--run-dir`: by module (another node, where
# the package is installed as it is there) or by this file without site-packages (here).
PORTABLE_PREFIX = ("-m", "orchestrator.executors.wrapper.run")
LOCAL_PREFIX = ("-S", str(WRAPPER_FILE))


def wrapper_argv(run_dir: Path, argv: list[str], *, portable: bool = False) -> list[str]:
    """The command line that runs `argv` under this wrapper. Here it runs this file under
    `python -S`: without site-packages' start-up (a third of a bare interpreter's, more with
    .pth files) the next worker starts sooner after a slot frees. `portable`: by module name,
    for a node that may have the package elsewhere."""
    prefix = PORTABLE_PREFIX if portable else LOCAL_PREFIX
    return [sys.executable, *prefix, "--run-dir", str(run_dir), "--", *argv]


def _own_create_time() -> float:
    """This process's start as psutil gives it, read from /proc: psutil's import is not paid
    before the worker starts."""
    stat = read_stat("self")
    created_s = create_time_s(stat) if stat is not None else None
    if created_s is not None:
        return created_s
    import psutil

    return float(psutil.Process().create_time())


_SITE_LOCK = threading.Lock()
_site_loaded = False


def _load_site() -> None:
    """site-packages for what runs after the worker started (NVML for the GPU peak sampler and
    the provenance record), once, whichever thread asks first."""
    global _site_loaded
    with _SITE_LOCK:
        if sys.flags.no_site and not _site_loaded:
            import site

            with contextlib.suppress(Exception):
                site.main()
        _site_loaded = True


def _record_provenance(held: HeldRunDir, argv: list[str]) -> None:
    """provenance.json (orchestrator.executors.provenance), from a thread once the worker runs:
    its imports and subprocesses are not paid before the worker starts."""
    _load_site()
    from orchestrator.executors.provenance import wrapper_record

    def cards() -> list[tuple[str, str, int]]:
        from orchestrator.gpu import make_probe

        probe = make_probe(None)
        try:
            return [(card.uuid, card.name, card.index) for card in probe.snapshot()]
        finally:
            probe.close()

    def driver() -> dict[str, str]:
        from orchestrator.gpu.nvml import driver_versions

        return driver_versions()

    with contextlib.suppress(Exception):  # a record we cannot make must not touch the attempt
        write_quietly(held, RunDir.PROVENANCE, wrapper_record(argv, Path.cwd(), cards, driver))


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def _hold_footprint(worker_pid: int) -> SimFootprint:
    """On simulated GPUs, the memory a worker that allocates none there is expected to hold
    (orchestrator.gpu.sim_footprint); nothing elsewhere."""
    footprint = SimFootprint(os.environ)
    stat = read_stat(worker_pid) if footprint.cards else None
    created_s = create_time_s(stat) if stat is not None else None
    if created_s is not None:
        footprint.hold(worker_pid, created_s)
    return footprint


def claim_run_dir(held: HeldRunDir, info: dict[str, Any]) -> bool:
    """Create pid.json exclusively, then look for the daemon's lost marker; False means the
    worker must not start.

    The daemon (lost_marker.mark_lost) creates the marker first and then looks for pid.json; we
    create pid.json first and then look for the marker. Each side writes its own flag before
    reading the other's, so at most one of them goes on: never a worker running for an
    attempt the daemon has already declared lost (and requeued)."""
    if held.has(RunDir.LOST_MARKER):
        return False
    if not held.write_json(RunDir.PID, info, exclusive=True):
        return False  # another wrapper has this run dir
    return not held.has(RunDir.LOST_MARKER)


def become_group_leader() -> int:
    """Lead a new session (hence a process group); return the pgid we end up in."""
    try:
        os.setsid()
    except PermissionError:
        # Already a process-group leader (e.g. started with start_new_session, or exec'd by the
        # tmux pane's shell). If we lead only a group, that is what killing needs.
        if os.getpgid(0) != os.getpid():
            os.setpgid(0, 0)
    return os.getpgid(0)


class _Tee:
    """Copies the worker's output to the log file and, while it can, to our stdout."""

    def __init__(self, source: IO[bytes], log: IO[bytes]) -> None:
        self.source = source
        self.log = log
        self.echo = True
        self.dropped_bytes = 0  # output that could not be logged (disk full)
        self.thread = threading.Thread(target=self._run, name="tee", daemon=True)

    def _run(self) -> None:
        while chunk := os.read(self.source.fileno(), 65536):
            try:
                self.log.write(chunk)
                self.log.flush()
            except OSError:
                # A full disk: this chunk is not logged, but the pipe is still drained (a
                # worker blocked on a full pipe would stop) and the pane still shows it.
                self.dropped_bytes += len(chunk)
            if self.echo:
                try:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.buffer.flush()
                except OSError:
                    self.echo = False  # the pane is gone (window killed): keep logging


def run(run_dir: Path, argv: list[str]) -> int:
    try:
        held = HeldRunDir(run_dir, create=True)
    except OSError as exc:  # a symlink, not ours, or not there: nothing is written anywhere
        print(f"orch wrapper: refusing run dir {run_dir}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    with held:
        return _run_held(held, argv)


def _run_held(held: HeldRunDir, argv: list[str]) -> int:
    """The attempt, with every record written through `held` (see held_dir)."""
    run_dir = held.path
    # A signal before the worker starts (the tmux server killed while this wrapper starts up:
    # SIGHUP) is kept and forwarded once the worker runs, so it is named in exit.json like any.
    early: list[int] = []
    for signum in FORWARDED:
        signal.signal(signum, lambda received_signum, _frame: early.append(received_signum))
    # A blocked signal mask is inherited through tmux (its server started by a process that had
    # SIGTERM blocked) down to the worker, which then ignored the SIGTERM forwarded to it and ran on
    # after a cancel: the wrapper, and the worker it starts, take these signals whatever came before.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    pgid = become_group_leader()
    # Before the worker starts: whatever it starts stays in the cgroup and, orphaned, in our
    # tree (strays), so none of it outlives the attempt or hides its GPU memory.
    cgroup = os.environ.get(CGROUP_VAR, "")
    in_cgroup = join_cgroup(cgroup)
    oom_kills_before = read_oom_kill_count(cgroup) if in_cgroup else None
    subreaper = become_subreaper()
    my_pid = os.getpid()
    info: dict[str, Any] = {
        "pid": my_pid,
        "pgid": pgid,
        "create_time": _own_create_time(),
        "started_at": _now(),
        "argv": argv,
    }
    try:
        claimed = claim_run_dir(held, info)
    except OSError as exc:
        print(f"orch wrapper: cannot claim {run_dir}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if not claimed:
        # No exit.json: the daemon already closed this attempt, or pid.json and a dead
        # wrapper tell it so on its next pass.
        print(f"orch wrapper: attempt in {run_dir} was declared lost; not starting it", file=sys.stderr)
        return EXIT_REFUSED

    with os.fdopen(held.open_append(RunDir.LOG), "ab") as log:
        try:
            child = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, close_fds=True
            )
        except OSError as exc:
            log.write(f"orch wrapper: cannot start {argv[0]!r}: {exc}\n".encode())
            write_quietly(
                held,
                RunDir.EXIT,
                {
                    "exit_code": EXIT_NOT_STARTED,
                    "signal": None,
                    "error": str(exc),
                    "ended_at": _now(),
                    "token": os.environ.get(TOKEN_VAR, ""),
                },
            )
            poke(run_dir)
            return EXIT_NOT_STARTED

        # Names, in order, for exit.json: the daemon tells "stopped from outside" (SIGHUP when
        # the tmux server dies, a stray SIGTERM) from a worker that failed by itself.
        received: list[str] = []
        forwarded: list[str] = []

        def forward(signum: int, _frame: FrameType | None) -> None:
            name = signal.Signals(signum).name
            if name in received:
                return  # a group kill reaches the worker too; once is enough
            received.append(name)
            sent = signal.SIGTERM if signum == signal.SIGHUP else signal.Signals(signum)
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(sent)
                forwarded.append(sent.name)

        for signum in FORWARDED:
            signal.signal(signum, forward)
        footprint = _hold_footprint(child.pid)
        for early_signum in early:
            forward(early_signum, None)
        write_quietly(held, RunDir.PID, {**info, "child_pid": child.pid})

        assert child.stdout is not None
        tee = _Tee(child.stdout, log)
        tee.thread.start()
        provenance = threading.Thread(target=_record_provenance, args=(held, argv), name="provenance", daemon=True)
        provenance.start()
        # our own tree's GPU memory, on this node; site-packages (NVML) loaded in its thread
        sampler = GpuPeakSampler(
            lambda peak: write_quietly(held, RunDir.GPU_PEAK, peak), my_pid, prepare=_load_site
        )
        sampler.start()
        reaper = OrphanReaper(child.pid) if subreaper else None
        if reaper is not None:
            reaper.start()
        returncode = child.wait()
        # before leftovers are looked for (its git and interpreter runs are ours, not the worker's)
        # and before exit.json (the daemon reads provenance.json at the attempt's end)
        provenance.join(PROVENANCE_WAIT_S)
        if reaper is not None:
            reaper.stop()
        left = descendants(my_pid)
        sampler.stop(final=bool(left))  # what the leftovers hold is the attempt's peak too
        footprint.release()
        leftovers = end_leftovers(my_pid) if left else []
        tee.thread.join(DRAIN_S)
        if tee.dropped_bytes:
            with contextlib.suppress(OSError, ValueError):
                log.write(f"orch wrapper: {tee.dropped_bytes} bytes of output not logged (disk full)\n".encode())

        killed_by = -returncode if returncode < 0 else None
        exit_code = 128 + killed_by if killed_by is not None else returncode
        oom_kills = oom_kills_since(oom_kills_before, read_oom_kill_count(cgroup) if in_cgroup else None)
        try:
            write_until_room(
                held,
                RunDir.EXIT,
                {
                    "exit_code": exit_code,
                    "signal": killed_by,
                    "signal_name": signal.Signals(killed_by).name if killed_by else None,
                    "received": received,
                    "forwarded": forwarded,
                    "ended_at": _now(),
                    "token": os.environ.get(TOKEN_VAR, ""),  # this attempt's: others' workers lack it
                    # processes the worker left running, ended here before this record
                    "leftovers": leftovers,
                    "tracking": [name for name, on in (("cgroup", in_cgroup), ("subreaper", subreaper)) if on],
                    # the kernel's OOM kills in the attempt's cgroup while it ran (null: unreadable)
                    "oom_kills": oom_kills,
                },
            )
        except RunDirMoved as exc:
            # The worker swapped its run dir (for a link elsewhere, say): nothing is written
            # through it; the daemon judges an attempt without its exit record.
            note = f"orch wrapper: {exc}"
            print(note, file=sys.stderr)
            with contextlib.suppress(OSError, ValueError):
                log.write(note.encode() + b"\n")
        except OSError as exc:
            print(f"orch wrapper: cannot write exit.json: {exc}", file=sys.stderr)
    poke(run_dir)  # the daemon hands the slot on now, not at its next pass
    return exit_code


def write_until_room(held: HeldRunDir, name: str, record: dict[str, Any]) -> None:
    """Write `record`, waiting while the disk is full: the daemon sees this wrapper alive and
    decides nothing until the record is there (a stop from orch still ends it: SIGKILL)."""
    said = False
    while True:
        try:
            held.write_json(name, record)
            return
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS or isinstance(exc, RunDirMoved):
                raise
            if not said:
                print(f"orch wrapper: disk full, waiting for room to write {name}", file=sys.stderr)
                said = True
            time.sleep(DISK_RETRY_S)


def main(argv: list[str] | None = None) -> int:
    os.umask(0o077)  # the log, records and whatever the worker writes are the user's alone
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[0] != "--run-dir" or args[2] != "--":
        print(
            "usage: python -m orchestrator.executors.wrapper.run --run-dir DIR -- ARGV...", file=sys.stderr
        )
        return 2
    return run(Path(args[1]), args[3:])


if __name__ == "__main__":
    code = main()
    # The daemon was poked after exit.json and waits for this process to end before it judges
    # the group: end now, without the interpreter's teardown (nothing is left to flush but these).
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # the pane may be gone
            stream.flush()
    os._exit(code)
