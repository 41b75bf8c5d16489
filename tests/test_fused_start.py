"""Who starts a fused slot's warm process (workers.lora.client._slot_connection): one client at a
time, so that jobs placed together start one process, not one each (the others lost the slot and
left dead windows); and a slot whose process is leaving is started again once it has left, not
after the start deadline."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from workers.lora.client import _slot_connection
from workers.lora.share import slot_paths, try_lock


class FakeProcess:
    """What `_start_server` opens, in a thread: after its start-up (a tmux window and an
    interpreter: the window in which other clients found the slot free) it takes the slot's lock,
    then listens."""

    STARTUP_S = 0.3

    def __init__(self, folder: Path, key: str, slot: int) -> None:
        self.sock_path, _, self.server_lock = slot_paths(folder, key, slot)
        self.starts = 0
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self) -> str | None:
        self.starts += 1
        self.threads.append(threading.Thread(target=self._serve))
        self.threads[-1].start()
        return None

    def _serve(self) -> None:
        if self.stop.wait(self.STARTUP_S):
            return
        held = try_lock(self.server_lock)
        if held is None:  # a second process: it loses the slot, as the real one does
            return
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.sock_path))
        listener.listen(64)
        listener.settimeout(0.1)
        accepted = []
        while not self.stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue
        for conn in accepted:
            conn.close()
        listener.close()
        os.close(held)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)


def test_jobs_placed_together_start_one_process_for_a_slot(tmp_path: Path) -> None:
    folder, key = tmp_path / "warm", "k"
    folder.mkdir()
    process = FakeProcess(folder, key, 0)
    found: list[tuple[socket.socket | None, str, str | None]] = []

    def client() -> None:
        found.append(_slot_connection(folder, key, 0, start=process.start))

    clients = [threading.Thread(target=client) for _ in range(6)]
    for each in clients:
        each.start()
    for each in clients:
        each.join(60)
    try:
        assert process.starts == 1
        assert len(found) == 6 and all(conn is not None and why is None for conn, _, why in found)
        assert sorted(started for _, started, _ in found) == [""] * 5 + [" (started for this job)"]
    finally:
        for conn, _, _ in found:
            if conn is not None:
                conn.close()
        process.close()


def test_a_slot_whose_process_is_leaving_is_started_again_once_it_has_left(tmp_path: Path) -> None:
    folder, key = tmp_path / "warm", "k"
    folder.mkdir()
    process = FakeProcess(folder, key, 0)
    leaving = try_lock(process.server_lock)  # its socket is gone, its lock held until it exits
    assert leaving is not None
    left = threading.Timer(0.3, os.close, (leaving,))
    left.start()
    try:
        conn, started, why = _slot_connection(folder, key, 0, start=process.start)
        # before, the client waited the whole start deadline (60 s) for a socket no one would open
        assert conn is not None and started == " (started for this job)" and why is None
        assert process.starts == 1
        conn.close()
    finally:
        left.join(10)
        process.close()


def test_a_start_that_fails_says_why(tmp_path: Path) -> None:
    folder, key = tmp_path / "warm", "k"
    folder.mkdir()
    said = "tmux could not open a window for a warm process: no server"
    assert _slot_connection(folder, key, 0, start=lambda: said) == (None, "", said)
