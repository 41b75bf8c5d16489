"""Whether a suite's or the daemon's notification URLs are ones Apprise understands, checked
before anything is queued or started (orchestrator.daemon.notify sends through them).

Apprise is the optional `notify` extra: it is imported only when a URL is given."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.errors import UsageError

INSTALL_HINT = "notifications need the notify extra: pip install 'orch[notify]' (Apprise)"


def check_urls(urls: Sequence[str], what: str = "--notify") -> None:
    """Refuse (UsageError, exit 2) a URL Apprise does not understand, or Apprise missing."""
    if not urls:
        return
    try:
        import apprise
    except ImportError:
        raise UsageError(f"{what}: {INSTALL_HINT}") from None
    for url in urls:
        if not apprise.Apprise().add(url):
            shown = url.split("://", 1)[0] + "://…" if "://" in url else repr(url[:40])
            raise UsageError(
                f"{what}: {shown} is not a notification URL Apprise understands "
                "(e.g. ntfy://TOPIC, slack://…, json://HOST:PORT/PATH)"
            )
