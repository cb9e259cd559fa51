"""The ``slr dashboard`` command: serve the live dashboard, or write its static export."""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import socket
import webbrowser
from pathlib import Path
from typing import Any

import click
import uvicorn

from slr.errors import UsageError
from slr_cli.dashboard.data import Decode, find_runs, tokenizer_decode


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def _url(host: str, port: int, token: str | None) -> str:
    if host in ("0.0.0.0", "::"):
        host = socket.gethostname()
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


class _Server(uvicorn.Server):
    """uvicorn, printing the URL once it is accepting connections."""

    def __init__(self, config: uvicorn.Config, on_ready: Any) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self._on_ready()


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(
            f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port "
            "(0 takes a free one) or stop what holds it"
        ) from None
    return sock


@click.command()
@click.argument(
    "runs_dir", default="runs", type=click.Path(file_okay=False, path_type=Path), required=False
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=8265, show_default=True, type=click.IntRange(0, 65535), help="0: any free."
)
@click.option(
    "--token",
    envvar="SLR_DASHBOARD_TOKEN",
    help="Require this token on every request. Off loopback one is required: without "
    "--token a random one is made and printed in the URL.",
)
@click.option(
    "--export",
    "export_to",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one self-contained HTML file (data inlined, opens with no server) and exit.",
)
@click.option(
    "--tokenizer",
    type=click.Path(exists=True, path_type=Path),
    help="tokenizer.json (or the model folder holding it) to show token text in the "
    "trajectory viewer; default: the run's [engine] model when it is a folder.",
)
@click.option("--open/--no-open", "open_browser", default=False, help="Open a browser on it.")
def dashboard(
    runs_dir: Path,
    host: str,
    port: int,
    token: str | None,
    export_to: Path | None,
    tokenizer: Path | None,
    open_browser: bool,
) -> None:
    """A web dashboard of runs: curves, outcomes, task grid, trajectories; live.

    RUNS_DIR is a run directory (runs/<run-id>) or the folder of runs (default: runs).
    Every panel reads the run directories only, live as they grow. It listens on loopback;
    any other address needs a token (--token, or one is generated and printed). The URL is
    printed on one line: ``dashboard: http://127.0.0.1:PORT/``.
    """
    find_runs(runs_dir)  # a clear error now for a folder that does not exist

    def decode_for(config: dict[str, Any]) -> Decode | None:
        return tokenizer_decode(tokenizer, config)

    if export_to is not None:
        from slr_cli.dashboard.export import export

        held = export(runs_dir, export_to, decode_for=decode_for)
        click.echo(f"exported {held['runs']} run(s), {held['trials']} trial(s) to {export_to}")
        return

    if not is_loopback(host) and not token:
        token = secrets.token_urlsafe(24)
    from slr_cli.dashboard.app import build_app

    app = build_app(runs_dir, token=token, decode_for=decode_for)
    sock = _bind(host, port)
    url = _url(host, sock.getsockname()[1], token)

    def ready() -> None:
        click.echo(f"dashboard: {url}")
        if open_browser:
            webbrowser.open(url)

    config = uvicorn.Config(
        app,
        log_level="warning",
        log_config=None,
        access_log=False,
        lifespan="on",
        # open event streams never end by themselves: Ctrl-C closes them after this long
        timeout_graceful_shutdown=2,
    )
    try:
        asyncio.run(_Server(config, ready).serve(sockets=[sock]))
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
