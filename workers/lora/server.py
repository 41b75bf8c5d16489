"""The warm LoRA worker process of `share_base: sequential`: it loads the base once and trains
the jobs its slot's clients hand it, one after another (the protocol: workers.lora.share).

Each job runs exactly as `python -m workers.lora` would run it (workers.lora.__main__.run_attempt,
writing progress.jsonl and result.json in the attempt's run dir, under the attempt's environment),
and afterwards the adapter is taken out of the base again (BaseCache.release). The process exits
when idle for ORCH_SHARE_IDLE_S seconds, after an error that is not the job's own (it may be
broken: the next client starts a fresh one), and when a stopped job does not stop within
STOP_GRACE_S (a hang).

With `--fused` it serves `share_base: fused` instead (workers.lora.fused): the jobs of its
clients train at once, as one group, up to the smallest ORCH_FUSE_MAX of the group's members;
one thread per client relays its output and its stop, the training runs in the main thread.

    python -m workers.lora.server --dir DIR --key KEY --slot N [--fused] [--env-file FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from workers.harness import Heartbeat
from workers.lora.resume_guard import holding_job
from workers.lora.share import (
    DEFAULT_IDLE_S,
    IDLE_VAR,
    messages,
    send,
    server_command,
    slot_paths,
    try_lock,
)

STOP_GRACE_S = 30.0  # a stopped job still running after this long: the process is replaced
# clients connecting at once wait in the socket's queue for an answer (a sweep's first jobs all
# try the first slot together)
LISTEN_BACKLOG = 64
EXIT_HUNG = 70


class StoppableHeartbeat(Heartbeat):
    """The job's progress lines; a beat after orch stopped the job ends it there."""

    def __init__(self, run_dir: Path, stop: threading.Event) -> None:
        super().__init__(run_dir)
        self.stop = stop

    def check_stopped(self) -> None:
        if self.stop.is_set():
            from workers.lora.__main__ import JobStopped

            raise JobStopped("orch stopped the attempt (cancelled, hung or its client gone)")

    def beat(self, *args: Any, **kwargs: Any) -> None:
        self.check_stopped()
        super().beat(*args, **kwargs)


class Relay(io.TextIOBase):
    """The job's output: to the client (its stdout.log and tmux window) and to this process's
    own window. A client gone loses the rest, not the job."""

    def __init__(self, conn: socket.socket, own: Any) -> None:
        self.conn, self.own, self.lock = conn, own, threading.Lock()

    def write(self, text: str) -> int:
        self.own.write(text)
        with self.lock, contextlib.suppress(OSError):
            send(self.conn, {"out": text})
        return len(text)

    def flush(self) -> None:
        self.own.flush()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def serve(folder: Path, key: str, slot: int, idle_s: float, fused: bool = False) -> int:
    """Listen on the slot's socket and train its jobs until idle; the exit code."""
    sock_path, client_lock, server_lock = slot_paths(folder, key, slot)
    if try_lock(server_lock) is None:
        log(f"another warm LoRA worker serves {key}-{slot}")
        return 0
    listener = _listen(sock_path)
    _close_window_on_exit()
    base_env = dict(os.environ)
    mode = "fused" if fused else "sequential"
    log(f"warm LoRA worker {key}-{slot} ({mode}, pid {os.getpid()}): ready, exits after {idle_s:g} s idle")
    try:
        if fused:
            from workers.lora.fused_server import serve_fused

            return serve_fused(listener, _new_cache, base_env, idle_s, sock_path)
        cache = _new_cache()  # torch: after the socket, clients wait on it
        while True:
            listener.settimeout(idle_s)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                if try_lock(client_lock) is not None:  # no client is on its way: leave
                    log(f"idle for {idle_s:g} s: exiting")
                    return 0
                continue
            conn.settimeout(None)
            if not serve_one(conn, cache, base_env):
                log(
                    "the last job left this process unusable: exiting (the next job starts a new "
                    "one)"
                )
                return 1
    finally:
        with contextlib.suppress(FileNotFoundError):
            sock_path.unlink()
        listener.close()


def _listen(sock_path: Path) -> socket.socket:
    """A socket listening at `sock_path`, which appears only once it listens (bound under a side
    name first, then renamed): a client that sees the path never meets a refused connection."""
    bound_path = sock_path.with_suffix(".bind")  # as long as ".sock": within the socket path limit
    for path in (sock_path, bound_path):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by a process of this slot that died: we hold the slot now
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(bound_path))
    os.chmod(bound_path, 0o600)
    listener.listen(LISTEN_BACKLOG)
    os.rename(bound_path, sock_path)
    return listener


def _new_cache() -> Any:
    from workers.lora.base_cache import BaseCache  # torch

    return BaseCache()


def serve_one(conn: socket.socket, cache: Any, base_env: dict[str, str]) -> bool:
    """Train the job a client sends; whether this process is still usable afterwards."""
    from workers.lora.__main__ import EXIT_FAILED, run_attempt

    reader = messages(conn)
    first = next(reader, None)
    job = first.get("job") if first else None
    if not isinstance(job, dict):
        conn.close()
        return True
    stop, done = threading.Event(), threading.Event()

    def watch() -> None:  # a stop message, or the client gone, stops the job
        for message in reader:
            if "stop" in message:
                break
        if done.is_set():
            return
        stop.set()
        if not done.wait(STOP_GRACE_S):
            log(f"the stopped job did not stop within {STOP_GRACE_S:g} s: exiting")
            os._exit(EXIT_HUNG)

    threading.Thread(target=watch, daemon=True).start()
    run_dir, config = Path(str(job.get("run_dir"))), Path(str(job.get("config")))
    env = {str(k): str(v) for k, v in (job.get("env") or {}).items()}
    log(f"job {env.get('ORCH_JOB_ID', '?')} attempt {env.get('ORCH_ATTEMPT', '?')}: {run_dir}")
    exit_code, usable = EXIT_FAILED, False
    if first and first.get("share_json"):  # a client that writes share.json: which process took the job
        with contextlib.suppress(OSError):
            send(conn, {"accepted": accepted(cache)})
    relay = Relay(conn, sys.__stdout__)
    try:
        os.environ.clear()
        os.environ.update(base_env | env)
        # the job's lock, held while this process trains it: a resume of its run dir waits on it
        with holding_job(run_dir, os.environ), contextlib.redirect_stdout(relay), contextlib.redirect_stderr(relay):
            end = run_attempt(run_dir, config, cache, StoppableHeartbeat(run_dir, stop))
        exit_code, usable = end.exit_code, end.process_usable
        cache.release()
    except Exception as exc:  # the process itself failed (not the job): say so, then leave
        log(f"warm LoRA worker failed: {type(exc).__name__}: {exc}")
        usable = False
    finally:
        os.environ.clear()
        os.environ.update(base_env)
        done.set()
    with contextlib.suppress(OSError):
        send(conn, {"exit": exit_code})
        conn.shutdown(socket.SHUT_RDWR)  # wakes the watcher's read; close alone would not
    conn.close()
    return usable


def accepted(cache: Any) -> dict[str, Any]:
    """What a client writes into its attempt's share.json: this process, and the memory its
    base holds on the card (None before the base is loaded, and on CPU)."""
    return {"pid": os.getpid(), "base_mem_mib": cache.base_mem_mib() if cache is not None else None}


def _close_window_on_exit() -> None:
    """orch's tmux keeps a window whose command ended (remain-on-exit); this one is closed."""
    pane = os.environ.get("TMUX_PANE")
    if pane and os.environ.get("TMUX") and shutil.which("tmux"):
        subprocess.run(
            ["tmux", "set-option", "-w", "-t", pane, "remain-on-exit", "off"],
            check=False,
            capture_output=True,
            timeout=10,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.lora.server", description=__doc__)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--slot", type=int, required=True)
    parser.add_argument("--env-file", type=Path, help="start again with this environment")
    parser.add_argument("--fused", action="store_true", help="serve share_base: fused")
    args = parser.parse_args(argv)
    if args.env_file is not None:  # started by a client through tmux: take the attempt's env
        env = json.loads(args.env_file.read_text(encoding="utf-8"))
        args.env_file.unlink()
        env |= {name: os.environ[name] for name in ("TMUX", "TMUX_PANE") if name in os.environ}
        os.execve(sys.executable, server_command(args.dir, args.key, args.slot, args.fused), env)
    idle_s = float(os.environ.get(IDLE_VAR) or DEFAULT_IDLE_S)
    return serve(args.dir, args.key, args.slot, idle_s, args.fused)


if __name__ == "__main__":
    raise SystemExit(main())
