"""The web page's HTTP connections, bounded: a cap on open connections and a read deadline.

uvicorn waits for a request's head for as long as a client keeps its connection open, so a
thousand half-sent requests hold a thousand file descriptors and, past the process's limit, leave
`orch web` unable to accept anyone. Here a connection beyond `MAX_CONNECTIONS` is closed as soon
as it is made, and one that has not sent a whole request within `REQUEST_READ_TIMEOUT_S` (or sat
idle that long after its last response) is closed. A response still being sent is never cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_CONNECTIONS = 256  # well under the usual 1,024 descriptors a process may hold
REQUEST_READ_TIMEOUT_S = 10.0


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection cap and a deadline for each request."""

    max_connections = MAX_CONNECTIONS
    read_timeout_s = REQUEST_READ_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._cycle_at_arming: object = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.close()  # connection_lost forgets it
            return
        self._arm()

    def _arm(self) -> None:
        self._cycle_at_arming = self.cycle
        self._deadline = self.loop.call_later(self.read_timeout_s, self._check_progress)

    def _check_progress(self) -> None:
        """Close a connection that started no new request since the deadline was armed and has
        no response in flight; otherwise look again one period later."""
        self._deadline = None
        if self.transport.is_closing():
            return
        busy = self.cycle is not None and not self.cycle.response_complete
        if not busy and self.cycle is self._cycle_at_arming:
            self.transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)


def raise_open_file_limit() -> None:
    """Take the hard limit on open files as the soft one, so the cap, not the limit, decides."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):  # else the limit we have: the cap still applies
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
