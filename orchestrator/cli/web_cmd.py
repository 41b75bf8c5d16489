"""`orch web` (the live page) and `orch report` (one self-contained HTML file)."""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
import socket
from pathlib import Path

import click

from orchestrator.cli.common import db_option, open_store, plans_option
from orchestrator.errors import UsageError
from orchestrator.plans import default_plans_dir
from orchestrator.rundir_files import write_text


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


@click.command("web")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (anything but localhost is warned about).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="Port (0: any free one).",
)
@plans_option
@db_option
def web_cmd(host: str, port: int, plans_dir: Path | None, db_path: Path) -> None:
    """Serve the live web page over state.db; actions need the token it prints."""
    try:
        import uvicorn

        from orchestrator.web.app import create_app
        from orchestrator.web.bounded_http import BoundedH11Protocol, raise_open_file_limit
    except ImportError:
        raise UsageError('orch web needs the web extra: pip install "orch[web]" (starlette, uvicorn)') from None
    open_store(db_path).close()  # fail now, clearly, on a missing or unreadable database
    loopback = _is_loopback(host)
    sock = _bind(host, port)
    bound_port = sock.getsockname()[1]
    token = secrets.token_urlsafe(24)
    shown_host = f"[{host.strip('[]')}]" if ":" in host else host
    if not loopback:
        click.echo(f"orch web: warning: listening on {host}, not only this machine; anyone who can reach it "
                   "can read the sweep (actions still need the token)", err=True)
    click.echo(f"orch web: serving {db_path} at http://{shown_host}:{bound_port}/")
    click.echo(
        "orch web: actions (cancel, retry, resume) need the token; open "
        f"http://{shown_host}:{bound_port}/?token={token}"
    )
    click.echo(f"orch web: token {token}", nl=True)
    # a retry takes the suite file as it is now, from the same plans folder `orch retry` reads
    app = create_app(Path(db_path), token, loopback_only=loopback, bound_host=host,
                     plans_dir=plans_dir or default_plans_dir())
    raise_open_file_limit()
    # bounded connections: half-sent requests can neither pile up nor hold the page hostage
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, access_log=False,
                            http=BoundedH11Protocol)
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])


@click.command("report")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="HTML file to write (e.g. sweep.html).")
@click.option("--title", default="orch sweep report", show_default=True, help="Heading of the report.")
@db_option
def report_cmd(out_path: Path, title: str, db_path: Path) -> None:
    """Write one self-contained HTML file: summary, failed jobs, timeline, memory, curves and results."""
    if not out_path.parent.is_dir():
        raise UsageError(f"--out: directory {str(out_path.parent)!r} does not exist")
    if out_path.is_dir():
        raise UsageError(f"--out: {str(out_path)!r} is a directory")
    from orchestrator.web.report import render_report

    with open_store(db_path) as store:
        html = render_report(store, title)
    write_text(out_path, html, mode=0o644)
    click.echo(f"wrote {out_path} ({len(html.encode()) / 1024:.0f} KiB)")


def register(group: click.Group) -> None:
    group.add_command(web_cmd)
    group.add_command(report_cmd)
