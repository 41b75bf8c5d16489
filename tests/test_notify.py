"""Notifications through Apprise to a local HTTP endpoint this test runs: a one-line summary
when a suite finishes and when a job ends `failed`, from `orch daemon start --notify URL` and
from a suite's `notify:` setting."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator.daemon.notify import job_failed_line, suite_finished_line
from orchestrator.store.notify_queries import TerminalEvent
from tests.conftest import OrchRunner
from tests.e2e_helpers import orch_env, requires_tmux, wait_until

pytest.importorskip("apprise")


class Inbox:
    """An HTTP server on 127.0.0.1 that keeps every JSON body POSTed to it, by path."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                inbox.received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"json://127.0.0.1:{self.port}/{path}"

    def messages(self, path: str) -> list[str]:
        return [body["message"] for p, body in self.received if p == f"/{path}"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    box = Inbox()
    yield box
    box.close()


@requires_tmux
def test_suite_finished_and_job_failed_are_sent(tmp_path: Path, inbox: Inbox) -> None:
    with orch_env(tmp_path) as orch:
        orch.write_suite(
            "overnight",
            {
                "good": {"sim_mem_gib": 1, "sim_seconds": 0.3},
                "bad": {"sim_mem_gib": 1, "sim_seconds": 0.4, "sim_fail": "error"},
            },
            notify=inbox.url("suite"),
        )
        # a script of the user's that dumps its environment (as experiment trackers do)
        orch.write_suite(
            "envdump", {"e": {}},
            worker=f"{sys.executable} -c \"import os; print(sorted(os.environ.items()))\"",
        )
        orch.submit("overnight", "1:glue_rte")
        orch.submit("envdump", "1:glue_rte")
        orch.run("daemon", "start", "--poll", "0.2", "--notify", inbox.url("daemon"))
        orch.wait_all_done(90)
        wait_until(lambda: len(inbox.messages("daemon")) >= 3 and len(inbox.messages("suite")) >= 2, 30,
                   "both notifications at both URLs")
        orch.stop_daemon()
    states = orch.job_states()
    assert sorted(states.values()) == ["failed", "succeeded", "succeeded"]
    # the URLs (tokens, in real services) never reach a worker's environment
    dumped = [Path(a["run_dir"]) / "stdout.log" for a in orch.attempts() if "envdump" in a["run_dir"]]
    assert dumped and "ORCH_SIM_GPUS" in dumped[0].read_text()
    assert str(inbox.port) not in dumped[0].read_text()
    failed_id = next(i for i, s in states.items() if s == "failed")
    for path in ("daemon", "suite"):
        messages = inbox.messages(path)
        # the daemon's URL hears of every suite; a suite's own URL of that suite only
        assert len(messages) == (3 if path == "daemon" else 2), messages
        failed = [m for m in messages if m.startswith(f"orch: job {failed_id} failed")]
        assert len(failed) == 1 and "overnight/bad seed 1 glue_rte" in failed[0]
        finished = [m for m in messages if m.startswith("orch: suite overnight finished")]
        assert any(m.startswith("orch: suite envdump finished") for m in messages) == (path == "daemon")
        assert finished == [f"orch: suite overnight finished: 1 succeeded, 1 failed ({orch.db})"]
        assert all("\n" not in m for m in messages)
    # the URL (a token, in real services) is not in the daemon's log
    assert str(inbox.port) not in (tmp_path / "state.db.daemon.log").read_text()


def test_bad_notify_urls_are_refused(orch_inproc: OrchRunner, tmp_path: Path, db_path: Path) -> None:
    bad = orch_inproc("daemon", "start", "--notify", "nonsense://x")
    assert bad.rc == 2 and "not a notification URL" in bad.stderr and len(bad.stderr.splitlines()) == 1
    plans = tmp_path / "plans"
    (plans / "suites").mkdir(parents=True)
    (plans / "configs" / "s").mkdir(parents=True)
    (plans / "configs" / "s" / "a.yaml").write_text("batch_size: 4\n")
    (plans / "suites" / "s.yaml").write_text("worker: sim\nmem_gib: 1\nconfigs: [a]\nnotify: nonsense://x\n")
    refused = orch_inproc("submit", "--suite", "s", "--pairs", "1:glue_rte", "--plans", str(plans))
    assert refused.rc == 2 and "not a notification URL" in refused.stderr
    assert not db_path.exists()


def test_lines_are_one_line_summaries() -> None:
    event = TerminalEvent(event_id=1, to_state="failed", job_id=7, suite="E1", config_name="r8", seed=87,
                          data="glue_rte", reason="RuntimeError: boom\nTraceback ...")
    assert job_failed_line(event) == "orch: job 7 failed (E1/r8 seed 87 glue_rte): RuntimeError: boom"
    assert suite_finished_line("E1", {"succeeded": 3, "cancelled": 1}, "state.db") == (
        "orch: suite E1 finished: 3 succeeded, 1 cancelled (state.db)"
    )
