"""What the browser tests share: Debian's Chromium through Playwright, where its screenshots go,
and `orch web` served on a free port for the length of a test."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from e2e_helpers import requires_tmux

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]  # fmt: skip
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "web"


class CliRunner(Protocol):
    def popen(self, *args: str) -> subprocess.Popen[str]: ...


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None where they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    if not CHROMIUM.exists():
        return "chromium is not installed (apt-get install chromium chromium-driver)"
    return None


# Skipped where the browser is absent on a developer's machine; in CI (env CI set) it runs and fails.
BROWSER_MARKS = [
    requires_tmux, pytest.mark.tmux, pytest.mark.browser, pytest.mark.slow,
    pytest.mark.skipif(browser_missing() is not None and not os.environ.get("CI"), reason=str(browser_missing())),
]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium, closed on leaving; the screenshot folder exists."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass(frozen=True)
class WebServer:
    url: str
    printed: list[str]  # its first three lines: the address, and the token on the third

    def token(self) -> str | None:
        found = re.search(r"token (\S+)", self.printed[2])
        return found.group(1) if found else None


@contextlib.contextmanager
def web_server(orch: CliRunner) -> Iterator[WebServer]:
    """`orch web` on a port the system gives it (`--port 0`: a port chosen here and bound later
    could be taken in between, by a test opening a thousand connections beside this one), once it
    has printed its address and token; stopped on leaving."""
    web = orch.popen("web", "--port", "0")
    try:
        assert web.stdout is not None
        printed = [web.stdout.readline() for _ in range(3)]
        found = re.search(r"http://127\.0\.0\.1:(\d+)", printed[0])
        assert found, printed
        yield WebServer(f"http://127.0.0.1:{found.group(1)}", printed)
    finally:
        web.terminate()
        try:
            web.wait(timeout=30)
        except subprocess.TimeoutExpired:
            web.kill()
            web.wait(timeout=30)
