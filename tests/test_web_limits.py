"""`orch web` under a flood of half-sent requests: the connections beyond the cap are closed at
once, the ones that never finish their request are closed after the read deadline, and the page
answers as soon as the flood stops (it used to stay unresponsive after 1,100 of them)."""

from __future__ import annotations

import os
import resource
import select
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.store import Store
from orchestrator.web.bounded_http import MAX_CONNECTIONS, REQUEST_READ_TIMEOUT_S
from tests.conftest import REPO_ROOT

pytest.importorskip("uvicorn")
HALF_SENT = 1100


@pytest.fixture
def web_port(db_path: Path) -> Iterator[int]:
    with Store(db_path):
        pass
    env = {**os.environ, "ORCH_DB": str(db_path), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "web", "--port", "0"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # "orch web: serving DB at http://127.0.0.1:PORT/"
        yield int(first.rsplit(":", 1)[1].strip().rstrip("/"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _closed_by_server(sock: socket.socket) -> bool:
    poller = select.poll()  # not select(): descriptors past 1,024 are out of its range
    poller.register(sock, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        return sock.recv(1) == b""
    except OSError:
        return True


def _page_answers(port: int, deadline_s: float) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as response:
                return response.status == 200
        except OSError:
            time.sleep(0.1)  # the next try of a poll with a deadline
    return False


def _half_sent(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
    return sock


def test_a_flood_of_half_sent_requests_neither_holds_nor_outlives_the_page(web_port: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < HALF_SENT + 100:
        pytest.skip(f"this test needs {HALF_SENT + 100} open files, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HALF_SENT + 100), hard))
    assert _page_answers(web_port, 30)
    flood = [_half_sent(web_port) for _ in range(HALF_SENT)]
    try:
        deadline = time.monotonic() + 30
        while True:
            refused = sum(_closed_by_server(s) for s in flood)
            if refused >= HALF_SENT - MAX_CONNECTIONS or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        # every connection beyond the cap is closed as soon as it is made
        assert refused >= HALF_SENT - MAX_CONNECTIONS
    finally:
        for sock in flood:
            sock.close()
    # the client gave up: the page answers again at once
    assert _page_answers(web_port, 15)


def test_a_request_never_finished_is_closed_after_the_read_deadline(web_port: int) -> None:
    assert _page_answers(web_port, 30)
    slow = [_half_sent(web_port) for _ in range(3)]
    try:
        started = time.monotonic()
        deadline = started + 2 * REQUEST_READ_TIMEOUT_S + 20
        while not all(_closed_by_server(s) for s in slow):
            assert time.monotonic() < deadline, "a half-sent request was kept open past its deadline"
            time.sleep(0.2)
        assert time.monotonic() - started >= REQUEST_READ_TIMEOUT_S * 0.9  # not cut before its time
    finally:
        for sock in slow:
            sock.close()
    assert _page_answers(web_port, 15)
