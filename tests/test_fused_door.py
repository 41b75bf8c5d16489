"""A fused warm process answers its clients before it imports torch (workers.lora.fused_server):
a sweep's first jobs all try the first slot at once, and the ones it turns away start the next
slot's process at once, so that the processes start side by side, not each after the one
before has imported torch and its libraries."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from workers.lora.fused_server import serve_fused
from workers.lora.share import messages, send

pytestmark = [pytest.mark.train]


def test_clients_are_answered_while_the_process_is_still_importing(tmp_path: Path) -> None:
    gate, made = threading.Event(), threading.Event()

    def make_cache() -> Any:  # the imports and the cache, held until the clients are answered
        assert gate.wait(60)
        from workers.lora.base_cache import BaseCache

        made.set()
        return BaseCache()

    sock_path = tmp_path / "slot.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    listener.listen(64)
    ended: list[int] = []
    server = threading.Thread(
        target=lambda: ended.append(serve_fused(listener, make_cache, dict(os.environ), 0.5, sock_path))
    )
    server.start()
    answers, conns = [], []
    for n in range(3):
        run_dir = tmp_path / f"job{n}"
        run_dir.mkdir()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(20)  # an answer held back until the cache is made fails the test, not hangs it
        conn.connect(str(sock_path))
        send(conn, {"job": {"run_dir": str(run_dir), "config": str(run_dir / "config.yaml"), "env": {}},
                    "fuse_max": 2})  # fmt: skip
        answers.append(next(messages(conn), None))
        conns.append(conn)
    assert not made.is_set()  # every answer came before the cache was made
    assert [answer is not None and "accepted" in answer for answer in answers] == [True, True, False]
    assert answers[0] == {"accepted": {"pid": os.getpid(), "base_mem_mib": None}}
    assert answers[2] == {"full": True}
    for conn in conns:  # the clients leave: their jobs end before they train; the process idles out
        conn.close()
    gate.set()
    server.join(60)
    assert made.is_set() and ended == [0]
    listener.close()
