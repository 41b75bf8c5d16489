"""The thin client an attempt of `share_base: sequential` runs in its own tmux window: it hands
its run dir to the warm LoRA worker process of its base key and card slot (starting one when
none runs), prints the job's output as it comes, relays orch's signals (a cancel or a hang kill
stops that job only) and exits with the job's exit code. Everything orch does per attempt (run
dir, the wrapper's exit.json, the wake FIFO, observation, stop) is unchanged: to orch this
client is the worker.

A job that cannot share (its LoRA spec trains base parameters), a config that cannot be read, or
a warm process that cannot be started (no tmux to start it in) trains in this process instead,
as with `share_base: off`, and the log says why.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from workers.lora.config import ConfigError, load_config
from workers.lora.share import (
    MAX_FUSED_MEMBERS,
    MAX_SLOTS,
    base_key,
    digest_of,
    messages,
    process_env,
    send,
    server_command,
    share_dir,
    slot_paths,
    try_lock,
    unshareable,
)

START_DEADLINE_S = 60.0  # a warm process started for us listens within this
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_shared(run_dir: Path, config_path: Path) -> int:
    """Train the attempt's job in a warm process; the exit code to exit with."""
    from workers.lora.__main__ import run_attempt

    try:
        config = load_config(config_path)
    except ConfigError:
        return run_attempt(run_dir, config_path).exit_code  # reports the config error
    reason = unshareable(config.peft)
    if reason is not None:
        log(f"share_base: {os.environ.get('ORCH_SHARE_BASE', 'sequential')}: training in this process: {reason}")
        return run_attempt(run_dir, config_path).exit_code
    from workers.lora.provenance import model_record

    try:
        model_digest = digest_of(model_record(config.model))
    except OSError:
        model_digest = ""
    key = base_key(config.model, model_digest, config.prec, os.environ)
    folder = share_dir(os.environ)
    job = {"run_dir": str(run_dir.resolve()), "config": str(config_path.resolve()), "env": dict(os.environ)}
    cap = fuse_max(os.environ)
    if os.environ.get("ORCH_SHARE_BASE") == "fused" and cap > 1:
        key = fused_key(key, config.max_seq_len, config.gradient_checkpointing, os.environ.get(FUSE_SUITE_VAR, ""))
        hello = {"job": job, "fuse_max": cap, **({"process": named} if (named := fuse_process(os.environ)) else {})}
        conn, why, first = _fused_connection(folder, key, hello)
        mode = "fused"
    else:
        conn, why = _warm_connection(folder, key)
        first, mode = None, "sequential"
        if conn is not None:
            send(conn, {"job": job, "share_json": True})
    if conn is None:
        log(f"share_base: {mode}: training in this process: {why}")
        return run_attempt(run_dir, config_path).exit_code
    log(f"share_base: {mode}: training in warm LoRA worker process {why}")
    return _relay(conn, run_dir, mode, why.split(" ")[0], first)


FUSE_SUITE_VAR = "ORCH_FUSE_SUITE"  # the suite: orch places the jobs of one suite as a group
FUSE_PROCESS_VAR = "ORCH_FUSE_PROCESS"  # the process orch placed the job in (a positive number)


def fused_key(key: str, max_seq_len: int, gradient_checkpointing: bool, suite: str = "") -> str:
    """The group key of a fused job: what one forward of the group shares must match (the base
    key, which holds the dtype; the sequence-length bucket; checkpointing), and the suite, as
    orch's placement groups jobs (a member of another suite would take room orch counted)."""
    parts: list[object] = [key, max_seq_len, gradient_checkpointing, "fused"]
    text = json.dumps([*parts, suite] if suite else parts)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fuse_max(env: Mapping[str, str]) -> int:
    """ORCH_FUSE_MAX: the most members the joined group may have (1..16; 1: sequential)."""
    try:
        return max(1, min(MAX_FUSED_MEMBERS, int(env.get("ORCH_FUSE_MAX") or 4)))
    except ValueError:
        return 4


def fuse_process(env: Mapping[str, str]) -> int | None:
    """ORCH_FUSE_PROCESS: the process orch placed the job in; None where not set or not a
    positive number (the job then joins the first process with room)."""
    text = env.get(FUSE_PROCESS_VAR, "")
    return int(text) if text.isascii() and text.isdigit() and 0 < int(text) < 2**62 else None


def _fused_connection(
    folder: Path, key: str, hello: dict[str, Any]
) -> tuple[socket.socket | None, str, dict[str, Any] | None]:
    """A fused warm process of `key` that accepted the job: (connection, where, its answer), or
    (None, why, None). A job orch named (`hello["process"]`) looks first for the process of its
    name among those that listen, and while that one is full (a member that ended still leaving)
    waits for it up to OWN_WAIT_S; then, as an unnamed job does, takes the first slot with room,
    starting a process where none listens."""
    if hello.get("process") is not None:
        deadline = time.monotonic() + OWN_WAIT_S
        while True:
            conn, where, answer, own_full = _own_process(folder, key, hello)
            if conn is not None or not own_full or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if conn is not None:
            return conn, where, answer
    for slot in range(MAX_SLOTS):
        conn, started, why = _slot_connection(folder, key, slot)
        if why is not None:
            return None, why, None
        if conn is None:
            continue
        answer = _ask(conn, hello)
        if answer is not None and "accepted" in answer:
            return conn, f"{key}-{slot}{started}", answer
        conn.close()  # full, or leaving: the next slot
    return None, f"all {MAX_SLOTS} fused warm processes of this base are full", None


OWN_WAIT_S = 10.0  # a named job waits this long for its own full process before taking another


def _slot_connection(
    folder: Path, key: str, slot: int, start: Callable[[], str | None] | None = None
) -> tuple[socket.socket | None, str, str | None]:
    """A connection to the fused process of this slot, starting one where none serves it:
    (connection or None when none listened in time, ' (started for this job)' or '', why no
    process could be started). One client at a time starts a slot's process (its start lock):
    jobs placed together found no socket together and each started one, which lost the race
    for the slot and left a dead window. A process that is leaving (idle) has closed its socket
    but holds the slot until it exits: then the next process is started once it has."""
    sock_path, _, server_lock = slot_paths(folder, key, slot)
    conn = _connect(sock_path)
    if conn is not None:
        return conn, "", None
    deadline = time.monotonic() + START_DEADLINE_S
    starting = _lock_within(folder / f"{key}-{slot}.start.lock", deadline)
    if starting is None:  # another client's start outlasted the deadline
        return None, "", None
    started = ""
    try:
        while time.monotonic() < deadline:
            conn = _connect(sock_path)
            if conn is not None:
                return conn, started, None
            held = None if started else try_lock(server_lock)
            if held is not None:  # nobody serves this slot (any more): start one
                os.close(held)
                why = (start or (lambda: _start_server(folder, key, slot, fused=True)))()
                if why is not None:
                    return None, "", why
                started = " (started for this job)"
            time.sleep(0.1)
        return None, "", None
    finally:
        os.close(starting)


def _lock_within(path: Path, deadline: float) -> int | None:
    """An exclusive lock on `path` taken before `deadline` (monotonic), else None."""
    while True:
        held = try_lock(path)
        if held is not None or time.monotonic() >= deadline:
            return held
        time.sleep(0.05)


def _own_process(
    folder: Path, key: str, hello: dict[str, Any]
) -> tuple[socket.socket | None, str, dict[str, Any] | None, bool]:
    """The listening process of the job's name that took it: (connection, where, answer, False);
    else (None, "", None, whether one of its name answered full)."""
    own_full = False
    for slot in range(MAX_SLOTS):
        sock_path = slot_paths(folder, key, slot)[0]
        if not sock_path.exists():
            continue
        conn = _connect(sock_path)
        if conn is None:
            continue
        answer = _ask(conn, {**hello, "own_only": True})
        if answer is not None and "accepted" in answer:
            return conn, f"{key}-{slot}", answer, False
        own_full = own_full or (answer or {}).get("why") == "full"
        conn.close()
    return None, "", None, own_full


def _ask(conn: socket.socket, hello: dict[str, Any]) -> dict[str, Any] | None:
    """The process's answer to the hello; None where it closed meanwhile (a broken pipe, a reset)."""
    try:
        send(conn, hello)
        return next(messages(conn), None)
    except OSError:
        return None


def _warm_connection(folder: Path, key: str) -> tuple[socket.socket | None, str]:
    """A connection to the warm process of our slot (the first slot of `key` no other attempt
    holds; the lock is kept until this process exits), starting one if none listens there;
    (None, why) when none can be had."""
    for slot in range(MAX_SLOTS):
        if try_lock(slot_paths(folder, key, slot)[1]) is not None:
            break
    else:
        return None, f"all {MAX_SLOTS} warm processes of this base are busy"
    sock_path = slot_paths(folder, key, slot)[0]
    conn = _connect(sock_path)
    if conn is not None:
        return conn, f"{key}-{slot}"
    started = _start_server(folder, key, slot)
    if started is not None:
        return None, started
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        conn = _connect(sock_path)
        if conn is not None:
            return conn, f"{key}-{slot} (started for this job)"
        time.sleep(0.1)
    return (
        None,
        f"the warm process started for {key}-{slot} did not listen within {START_DEADLINE_S:g} s",
    )


def _connect(path: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        return None
    return conn


def _start_server(folder: Path, key: str, slot: int, fused: bool = False) -> str | None:
    """Open a tmux window running the warm process of this slot (outside this attempt: it
    outlives it); None when started, else why not."""
    if not os.environ.get("TMUX") or shutil.which("tmux") is None:
        return "no warm process runs for this base and card, and none can be started outside tmux"
    env_file = folder / f"{key}-{slot}.env.json"
    fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(process_env(os.environ), handle)
    command = shlex.join(server_command(folder, key, slot, fused, env_file))
    path_env = (
        ["-e", f"PYTHONPATH={os.environ['PYTHONPATH']}"] if os.environ.get("PYTHONPATH") else []
    )
    done = subprocess.run(
        [
            "tmux",
            "new-window",
            "-d",
            "-n",
            f"warm-{key[:8]}-{slot}",
            "-c",
            os.getcwd(),
            *path_env,
            f"exec {command}",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        return f"tmux could not open a window for a warm process: {done.stderr.strip()[:200]}"
    return None


def _relay(
    conn: socket.socket, run_dir: Path, mode: str, process: str, first: dict[str, Any] | None
) -> int:
    """Print what the job prints, relay signals, write share.json once accepted; the job's exit
    code. The job was handed over already (`first`: the answer read meanwhile)."""
    from workers.lora.__main__ import EXIT_FAILED

    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        with contextlib.suppress(OSError):
            send(conn, {"stop": signal.Signals(signum).name})

    for signum in RELAYED:
        signal.signal(signum, on_signal)
    exit_code: int | None = None
    for message in itertools.chain([first] if first else [], messages(conn)):
        if isinstance(message.get("out"), str):
            sys.stdout.write(message["out"])
            sys.stdout.flush()
        elif isinstance(message.get("accepted"), dict):
            write_share_json(run_dir, mode, process, message["accepted"])
        elif isinstance(message.get("exit"), int):
            exit_code = message["exit"]
            break
    conn.close()
    if received:  # end as a worker ended by that signal would
        signal.signal(received[0], signal.SIG_DFL)
        os.kill(os.getpid(), received[0])
    if exit_code is None:
        log(
            "the warm LoRA worker process ended while it trained this job (see its window); "
            "the next attempt starts a new one"
        )
        return EXIT_FAILED
    return exit_code


def write_share_json(run_dir: Path, mode: str, process: str, answer: dict[str, Any]) -> None:
    """share.json: which warm process trains this attempt (orch shows jobs sharing one)."""
    pid, mem = answer.get("pid"), answer.get("base_mem_mib")
    record = {
        "mode": mode, "process": process, "pid": pid if isinstance(pid, int) else None,
        "base_mem_mib": mem if isinstance(mem, int) else None,
    }  # fmt: skip
    partial = run_dir / ".share.json.partial"
    partial.write_text(json.dumps(record) + "\n", encoding="utf-8")
    os.replace(partial, run_dir / "share.json")
