"""A fused warm process answers its clients before it imports torch (workers.lora.fused_server):
a sweep's first jobs all try the first slot at once, and the ones it turns away start the next
slot's process at once, so that the processes start side by side, not each after the one
before has imported torch and its libraries."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from workers.lora.fused_server import Door, serve_fused
from workers.lora.share import messages, send

pytest.importorskip("torch")
pytestmark = [pytest.mark.train]


def _client(sock_path: Path, run_dir: Path, fuse_max: int = 2) -> tuple[socket.socket, Any]:
    """A client's hello to the process; its connection and the answer."""
    run_dir.mkdir()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(20)  # an answer held back until the cache is made fails the test, not hangs it
    conn.connect(str(sock_path))
    send(conn, {"job": {"run_dir": str(run_dir), "config": str(run_dir / "config.yaml"), "env": {}},
                "fuse_max": fuse_max})  # fmt: skip
    return conn, next(messages(conn), None)


def _listening(sock_path: Path) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    listener.listen(64)
    return listener


def test_clients_are_answered_while_the_process_is_still_importing(tmp_path: Path) -> None:
    gate, made = threading.Event(), threading.Event()

    def make_cache() -> Any:  # the imports and the cache, held until the clients are answered
        assert gate.wait(60)
        from workers.lora.base_cache import BaseCache

        made.set()
        return BaseCache()

    sock_path = tmp_path / "slot.sock"
    listener = _listening(sock_path)
    door = Door()
    ended: list[int] = []
    server = threading.Thread(
        target=lambda: ended.append(serve_fused(listener, make_cache, dict(os.environ), 0.5, sock_path, door))
    )
    server.start()
    answers, conns = [], []
    for n in range(3):
        conn, answer = _client(sock_path, tmp_path / f"job{n}")
        answers.append(answer)
        conns.append(conn)
    assert not made.is_set()  # every answer came before the cache was made
    assert [answer is not None and "accepted" in answer for answer in answers] == [True, True, False]
    assert answers[0] == {"accepted": {"pid": os.getpid(), "base_mem_mib": None}}
    assert answers[2] == {"full": True, "why": "full"}
    for conn in conns:  # the clients leave: their jobs end before they train; the process idles out
        conn.close()
    deadline = time.monotonic() + 20
    while door.caps and time.monotonic() < deadline:  # each withdrawn before the trainer starts
        time.sleep(0.05)  # polling the door's count, with the deadline above
    assert not door.caps
    gate.set()
    server.join(60)
    assert made.is_set() and ended == [0]
    listener.close()


def test_jobs_accepted_before_the_process_fails_to_start_its_trainer_end_failed_saying_why(tmp_path: Path) -> None:
    gate = threading.Event()

    def make_cache() -> Any:  # an import that fails, once a client was accepted
        assert gate.wait(60)
        raise ImportError("no module named 'peft'")

    sock_path = tmp_path / "slot.sock"
    listener = _listening(sock_path)
    raised: list[BaseException] = []

    def serve() -> None:
        try:
            serve_fused(listener, make_cache, dict(os.environ), 0.5, sock_path)
        except BaseException as exc:  # the process's own end: it exits with the traceback
            raised.append(exc)

    server = threading.Thread(target=serve)
    server.start()
    conn, answer = _client(sock_path, tmp_path / "job")
    assert answer is not None and "accepted" in answer
    gate.set()
    said = list(messages(conn))  # the job's output, then its end
    server.join(60)
    assert isinstance(raised[0], ImportError)
    assert said[-1] == {"exit": 1}
    text = "".join(m.get("out", "") for m in said[:-1])
    assert "could not start its trainer: ImportError: no module named 'peft'" in text, said
    listener.close()


def test_a_process_takes_only_the_group_orch_placed_in_it_and_serves_the_next_once_empty() -> None:
    door = Door()
    assert door.enter(1, 3, process=7, own_only=True) == "other"  # idle: no member of its name yet
    assert door.enter(1, 3, process=7) is None  # idle: takes the name of its first member
    assert door.enter(2, 3, process=7, own_only=True) is None
    assert door.enter(3, 3, process=9) == "other"  # another group's: its own process is elsewhere
    assert door.enter(4, 3) is None  # a job orch did not name (placed before names) joins where there is room
    assert door.enter(5, 3, process=7, own_only=True) == "full"  # its own, at its cap: it may wait for it
    for job in (1, 2, 4):
        door.leave(job)
    assert door.process is None
    assert door.enter(3, 3, process=9) is None  # empty: the next group takes it, warm
    assert door.enter(6, 3, process=7) == "other"
    legacy = Door()  # members orch did not name: a named job joins, and the process takes no name
    assert legacy.enter(1, 3) is None and legacy.enter(2, 3, process=7) is None and legacy.process is None
    assert legacy.enter(3, 3, process=9) is None


def test_the_process_a_client_names_is_a_positive_number_or_none() -> None:
    from workers.lora.client import fuse_process

    assert fuse_process({"ORCH_FUSE_PROCESS": "12"}) == 12
    for text in ("", "0", "-3", "1.5", "x", "١٢", "9" * 30):
        assert fuse_process({"ORCH_FUSE_PROCESS": text}) is None
    assert fuse_process({}) is None


def test_a_named_client_finds_its_own_process_before_an_idle_one(tmp_path: Path) -> None:
    from workers.lora.client import _fused_connection
    from workers.lora.share import slot_paths

    folder, key = tmp_path / "warm", "k"
    folder.mkdir()
    gate = threading.Event()

    def make_cache() -> Any:  # held until the end: the processes only answer
        assert gate.wait(60)
        from workers.lora.base_cache import BaseCache

        return BaseCache()

    doors, servers, listeners = [], [], []
    for slot in range(2):
        sock_path = slot_paths(folder, key, slot)[0]
        listeners.append(_listening(sock_path))
        doors.append(Door())
        servers.append(threading.Thread(target=serve_fused, args=(listeners[-1], make_cache, dict(os.environ), 0.5,
                                                                  sock_path, doors[-1])))
        servers[-1].start()
    assert doors[1].enter(999, 4, process=40) is None  # slot 1 trains a member of process 40; slot 0 is idle

    def hello(run_dir: Path, process: int) -> dict[str, Any]:
        run_dir.mkdir()
        job = {"run_dir": str(run_dir), "config": str(run_dir / "config.yaml"), "env": {}}
        return {"job": job, "fuse_max": 4, "process": process}

    conn, where, answer = _fused_connection(folder, key, hello(tmp_path / "own", 40))
    assert conn is not None and where == "k-1" and answer is not None and "accepted" in answer
    other, where_other, _ = _fused_connection(folder, key, hello(tmp_path / "new", 41))
    assert other is not None and where_other == "k-0"  # no process of its name: the idle one takes it
    assert doors[0].process == 41 and doors[1].process == 40
    for each in (conn, other):
        each.close()
    doors[1].leave(999)
    gate.set()
    for server in servers:
        server.join(60)
    for listener in listeners:
        listener.close()
