"""Notifications: a one-line summary when a suite finishes or a job ends `failed`, sent through
Apprise (Slack, Discord, Telegram, e-mail, ntfy, webhooks, ... with one URL scheme).

Apprise is the optional `notify` extra: nothing here imports it until a URL is configured.
Sending happens on a worker thread, so a slow endpoint never holds up a scheduling pass; URLs
carry tokens, so they are never logged."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from orchestrator.lifecycle import TERMINAL_VALUES, JobState
from orchestrator.store.db import Store
from orchestrator.store.notify_queries import (
    TerminalEvent,
    last_event_id,
    suite_counts,
    suite_notify_urls,
    terminal_events_since,
)

log = logging.getLogger(__name__)
def job_failed_line(event: TerminalEvent) -> str:
    reason = (event.reason or "no reason recorded").splitlines()[0][:300]
    return (f"orch: job {event.job_id} failed ({event.suite}/{event.config_name} seed {event.seed} "
            f"{event.data}): {reason}")


def suite_finished_line(suite: str, counts: dict[str, int], db: str) -> str:
    parts = [f"{counts.get(s, 0)} {s}" for s in TERMINAL_VALUES if counts.get(s)]
    return f"orch: suite {suite} finished: {', '.join(parts) or 'no jobs'} ({db})"


class Sender:
    """Sends on one background thread; `close` waits for what is queued."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orch-notify")

    def send(self, urls: Iterable[str], title: str, body: str) -> None:
        targets = sorted(set(urls))
        if targets:
            self._pool.submit(_deliver, targets, title, body)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _deliver(urls: list[str], title: str, body: str) -> bool:
    try:
        import apprise

        sender = apprise.Apprise()
        for url in urls:
            sender.add(url)
        ok = bool(sender.notify(title=title, body=body))
    except Exception:  # a notification must never take the daemon down
        log.warning("notification failed: %s", title, exc_info=True)
        return False
    if ok:
        log.info("notification sent to %d URL(s): %s", len(urls), title)
    else:
        log.warning("notification to %d URL(s) not delivered: %s", len(urls), title)
    return ok


class Watcher:
    """Turns job events into notifications: each pass reads the events since the last one."""

    def __init__(self, store: Store, daemon_urls: Sequence[str], sender: Sender | None = None) -> None:
        self.store = store
        self.daemon_urls = tuple(daemon_urls)
        self.sender = sender or Sender()
        self.cursor = last_event_id(store)  # what happened before this daemon is not news

    def poll(self) -> None:
        events = terminal_events_since(self.store, self.cursor)
        if not events:
            return
        self.cursor = max(e.event_id for e in events)
        suites: dict[str, None] = {}
        for event in events:
            suites[event.suite] = None
            if event.to_state == JobState.FAILED.value:
                urls = self._urls(event.suite)
                if urls:
                    self.sender.send(urls, f"orch: job {event.job_id} failed", job_failed_line(event))
        for suite in suites:
            counts = suite_counts(self.store, suite)
            if counts.get("queued", 0) == 0 and counts.get("running", 0) == 0:
                urls = self._urls(suite)
                if urls:
                    line = suite_finished_line(suite, counts, str(self.store.path))
                    self.sender.send(urls, f"orch: suite {suite} finished", line)

    def _urls(self, suite: str) -> list[str]:
        return [*self.daemon_urls, *suite_notify_urls(self.store, suite)]

    def close(self) -> None:
        self.sender.close()
