"""The warm process of `share_base: fused` (workers.lora.server --fused): its clients' jobs train
at once as one group (workers.lora.fused.FusedTrainer, in the main thread).

A client sends `{"job": {...}, "fuse_max": N}`, and `"process": P` where orch named the process
it placed the job in (ORCH_FUSE_PROCESS). The process takes it while the group (with the jobs
accepted but not yet joined) has fewer members than the smallest `fuse_max` among them and the
newcomer, and, for a named job, while it has no member or its members came under that name or
none (an idle process takes the name of the first, and drops it once empty; a process of jobs
orch did not name keeps none): so the groups that train are the ones orch placed, and a warm
process serves the next group. With `"own_only": true` it takes the job only into members of its
name (the client's first pass over the slots, so that it never takes an idle process while its
own has room). It answers `{"accepted": {"pid", "base_mem_mib"}}`; else `{"full": true, "why":
"full" | "other" | "closing"}` (the client tries the next slot).
A job joins the group at the next tick. One thread per client relays the job's output (its own
only: each member's code runs with its stdout and stderr on its relay) and turns a stop message,
or the client gone, into a stop: the job leaves at the next tick without a checkpoint. The
process exits after ORCH_SHARE_IDLE_S without a member, refusing the clients that arrive
meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workers.lora.__main__ import EXIT_FAILED, EXIT_STOPPED
from workers.lora.member import PROCESS_ENDED, MemberSpec
from workers.lora.resume_guard import holding_job
from workers.lora.server import EXIT_HUNG, STOP_GRACE_S, Relay, StoppableHeartbeat, accepted
from workers.lora.share import MAX_FUSED_MEMBERS, messages, send

FAIL_DRAIN_S = 10.0  # a process that cannot train waits this long for the jobs it accepted to arrive


def log(message: str) -> None:
    """This process's own lines: its window (the main thread's stderr is a member's meanwhile)."""
    print(message, file=sys.__stderr__, flush=True)


class Door:
    """Who may join: the members' caps, and whether the process is closing."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.caps: dict[int, int] = {}  # per accepted job (until it ends): its fuse_max
        self.closing = False
        self.arrivals: queue.Queue[MemberSpec] = queue.Queue()
        self.process: int | None = None  # the name its members came under (None: none named yet)

    def enter(self, job_id: int, cap: int, process: int | None = None, own_only: bool = False) -> str | None:
        """None when the job is taken, else why not: `closing`, `other` (its members came under
        another name; with `own_only`, also an idle or unnamed process) or `full` (at its cap)."""
        with self.lock:
            if self.closing:
                return "closing"
            if process is not None and (self.process if self.caps else None) not in (None, process):
                return "other"  # another group's process: the job's own is elsewhere, or to start
            if own_only and (not self.caps or self.process != process):
                return "other"
            limit = min([cap, *self.caps.values()])
            if len(self.caps) + 1 > limit:
                return "full"
            if process is not None and not self.caps:
                self.process = process  # idle: it takes the name (with unnamed members, none)
            self.caps[job_id] = cap
            return None

    def leave(self, job_id: int) -> None:
        with self.lock:
            self.caps.pop(job_id, None)
            if not self.caps:
                self.process = None  # empty: the next group may take it, warm

    def close_if_empty(self) -> bool:
        with self.lock:
            if self.caps:
                return False
            self.closing = True
            return True


def serve_fused(
    listener: socket.socket, make_cache: Callable[[], Any], base_env: dict[str, str], idle_s: float, sock_path: Path,
    door: Door | None = None,
) -> int:  # fmt: skip
    """Accept clients in a thread, train their jobs here; the exit code. Clients are answered
    from the start: the cache (torch, its imports) is made meanwhile, so the clients a full
    process turns away start the next slot's process without waiting for this one's imports.
    `door`: who may join (a new one when not given)."""
    door = door or Door()
    ready: list[Any] = []  # the cache, once made (an answer before it says no base memory)
    listener.settimeout(None)

    def accept_loop() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed: the process is leaving
            threading.Thread(target=_client, args=(conn, door, ready), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    try:
        ready.append(make_cache())
        from workers.lora.fused import FusedTrainer  # torch

        trainer = FusedTrainer(ready[0], base_env)
    except BaseException as exc:  # an import or the cache failed: the jobs accepted meanwhile say why
        _fail_accepted(door, f"the warm LoRA worker process could not start its trainer: {type(exc).__name__}: {exc}")
        raise

    def admit(idle: bool) -> list[MemberSpec] | None:
        new: list[MemberSpec] = []
        if idle:
            while True:
                try:
                    new.append(door.arrivals.get(timeout=idle_s))
                    break
                except queue.Empty:
                    if door.close_if_empty():
                        log(f"idle for {idle_s:g} s: exiting")
                        with contextlib.suppress(FileNotFoundError):
                            sock_path.unlink()
                        return None
        while True:
            try:
                new.append(door.arrivals.get_nowait())
            except queue.Empty:
                return new

    usable = trainer.run(admit)
    with door.lock:
        door.closing = True  # a client arriving now is refused (it tries the next slot)
    if not usable:
        log("a job left this process unusable: exiting (the next job starts a new one)")
    return 0 if usable else 1


def _fail_accepted(door: Door, why: str) -> None:
    """The process cannot train: no client is accepted from now on, and each job accepted
    meanwhile ends failed with `why` in its own output (the process's window closes with it)."""
    log(why)
    with door.lock:
        door.closing = True
    deadline = time.monotonic() + FAIL_DRAIN_S
    while time.monotonic() < deadline:
        try:
            spec = door.arrivals.get(timeout=0.1)
        except queue.Empty:
            with door.lock:
                if not door.caps:  # every accepted job ended (or withdrew)
                    return
            continue
        if spec.claim():
            print(f"orch: {why}", file=spec.out or sys.__stderr__, flush=True)
            spec.done(EXIT_FAILED)


def _client(conn: socket.socket, door: Door, ready: list[Any]) -> None:
    """One client: admission, then its stop; its job's end is sent by the trainer's thread."""
    reader = messages(conn)
    first = next(reader, None)
    job = first.get("job") if first else None
    if not isinstance(job, dict):
        conn.close()
        return
    try:
        cap = max(1, min(MAX_FUSED_MEMBERS, int(first.get("fuse_max") or 1)))  # type: ignore[union-attr]
    except (TypeError, ValueError):
        cap = 1
    named = first.get("process")  # type: ignore[union-attr]
    process = named if isinstance(named, int) and not isinstance(named, bool) and named > 0 else None
    job_id = id(conn)
    refused = door.enter(job_id, cap, process, own_only=first.get("own_only") is True)  # type: ignore[union-attr]
    if refused is not None:
        with contextlib.suppress(OSError):
            send(conn, {"full": True, "why": refused})
        conn.close()
        return
    stop, done = threading.Event(), threading.Event()
    lock = threading.Lock()
    held = contextlib.ExitStack()  # the job's lock while it is a member: a resume of it waits
    spec: MemberSpec | None = None

    def end(exit_code: int) -> None:
        held.close()
        door.leave(job_id)
        done.set()
        if spec is not None:
            spec.seen.set()
        with lock, contextlib.suppress(OSError):
            if exit_code != PROCESS_ENDED:  # else no answer: the client says the process ended
                send(conn, {"exit": exit_code})
            conn.shutdown(socket.SHUT_RDWR)  # wakes the reader below
        conn.close()

    run_dir, config = Path(str(job.get("run_dir"))), Path(str(job.get("config")))
    env = {str(k): str(v) for k, v in (job.get("env") or {}).items()}
    log(f"job {env.get('ORCH_JOB_ID', '?')} attempt {env.get('ORCH_ATTEMPT', '?')} joins: {run_dir}")
    try:
        send(conn, {"accepted": accepted(ready[0] if ready else None)})
    except OSError:
        door.leave(job_id)
        conn.close()
        return
    try:
        held.enter_context(holding_job(run_dir, env, log))
    except OSError as exc:
        log(f"the job's lock could not be opened ({exc}): it ends failed")
        end(EXIT_FAILED)
        return
    spec = MemberSpec(run_dir, config, env, Relay(conn, sys.__stdout__), stop, end,
                      lambda path, event: StoppableHeartbeat(path, event))  # fmt: skip
    door.arrivals.put(spec)
    for message in reader:  # a stop message, or the client gone, stops the job
        if "stop" in message:
            break
    if done.is_set():
        return
    stop.set()
    if spec.withdraw():  # queued, or waiting to train alone: nothing of it runs; it ends now
        end(EXIT_STOPPED)
        return
    # the trainer sees the stop at its next check (between ticks, before any evaluation and
    # setup); only a stop seen and not honoured within the grace is a hang of this process
    spec.seen.wait()
    if not done.wait(STOP_GRACE_S):
        log(f"a stopped job did not stop within {STOP_GRACE_S:g} s: exiting")
        os._exit(EXIT_HUNG)
